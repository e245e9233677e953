"""The AWS adapter: EC2 GPU instances, spot and on-demand, through boto3.

Needs the ``aws`` extra (boto3). See docs/providers-aws.md for the APIs it
calls, the IAM permissions they need and how credentials are found.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from spotd.core.lazy import lazy_exports

from .kind import KIND
from .settings import AwsSettings

if TYPE_CHECKING:
    from .adapter import AwsProvider, build_aws_provider
    from .errors import map_aws_errors

# boto3 is an extra: importing the settings must not need it, so the adapter
# and its SDK load on first use of a name below.
_LAZY = {
    "AwsProvider": ".adapter",
    "build_aws_provider": ".adapter",
    "map_aws_errors": ".errors",
}


__getattr__ = lazy_exports(__name__, _LAZY)


__all__ = ["KIND", "AwsProvider", "AwsSettings", "build_aws_provider", "map_aws_errors"]
