"""Each simulated node's own address, so a multi-node job really crosses hosts.

The whole of 127.0.0.0/8 reaches this machine over loopback, so every node
gets an address of its own there (never 127.0.0.1, which the daemon has)
without any setup. Addresses are handed out from a counter in the state
directory, under the launch lock, so no two nodes of any provider sharing
the directory get the same one until millions of nodes later.
"""

from __future__ import annotations

from pathlib import Path

_SPAN = 250  # usable values of one octet: 1..250 (no .0, no broadcast-looking .255)
_SECOND_OCTET = 100  # 127.100.x.y upwards: clear of 127.0.0.x, which hosts use themselves


def address_of(n: int) -> str:
    """The ``n``-th node address (0-based)."""
    n %= 100 * _SPAN * _SPAN
    second, rest = divmod(n, _SPAN * _SPAN)
    third, fourth = divmod(rest, _SPAN)
    return f"127.{_SECOND_OCTET + second}.{third + 1}.{fourth + 1}"


def next_address(counter: Path) -> str:
    """Take the next address; the caller holds the launch lock."""
    try:
        n = int(counter.read_text().strip() or 0)
    except FileNotFoundError:
        n = 0
    tmp = counter.with_suffix(".tmp")
    tmp.write_text(str(n + 1))
    tmp.replace(counter)
    return address_of(n)
