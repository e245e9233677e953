#!/bin/sh
# Entry point of the spotd image (deploy/Containerfile): turns files mounted
# from secrets into what spotd reads, then runs `spotd "$@"` (default: daemon).
#
#   SPOTD_DATABASE_URL_FILE   a file holding the database URL: exported as
#                             SPOTD_DATABASE_URL (its password stays out of
#                             the compose file and the pod spec)
#   SPOTD_API_TOKEN_FILE      a file holding the API token: copied to
#                             <data_dir>/token with mode 0600, so that every
#                             daemon behind one address accepts the same token
#   SPOTD_SECRETS_TOML_FILE   a [secrets] file of NAME = "value" lines: copied
#                             to <data_dir>/secrets.toml with mode 0600 (a
#                             mounted secret is owned by root or readable by its
#                             group, which [secrets] file refuses) and named in
#                             SPOTD_SECRETS__FILE
#
# The three variables are unset before spotd starts.
set -eu

data_dir="${SPOTD_DATA_DIR:-/var/lib/spotd}"
umask 077

if [ -n "${SPOTD_DATABASE_URL_FILE:-}" ]; then
    SPOTD_DATABASE_URL="$(cat "$SPOTD_DATABASE_URL_FILE")"
    export SPOTD_DATABASE_URL
fi

if [ -n "${SPOTD_API_TOKEN_FILE:-}" ]; then
    mkdir -p "$data_dir"
    # The daemon keeps a token file that exists (spotd/daemon/tokens.py).
    tr -d '\n' < "$SPOTD_API_TOKEN_FILE" > "$data_dir/token.new"
    [ -s "$data_dir/token.new" ] || { echo "spotd-entrypoint: $SPOTD_API_TOKEN_FILE is empty" >&2; exit 1; }
    mv -f "$data_dir/token.new" "$data_dir/token"
fi

if [ -n "${SPOTD_SECRETS_TOML_FILE:-}" ]; then
    mkdir -p "$data_dir"
    cat "$SPOTD_SECRETS_TOML_FILE" > "$data_dir/secrets.toml.new"
    mv -f "$data_dir/secrets.toml.new" "$data_dir/secrets.toml"
    SPOTD_SECRETS__FILE="$data_dir/secrets.toml"
    export SPOTD_SECRETS__FILE
fi

unset SPOTD_DATABASE_URL_FILE SPOTD_API_TOKEN_FILE SPOTD_SECRETS_TOML_FILE
exec spotd "$@"
