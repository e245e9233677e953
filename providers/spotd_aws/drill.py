"""Drills on EC2 (``spotd drill``): a spot interruption sent by AWS Fault Injection Service.

FIS's action ``aws:ec2:send-spot-instance-interruptions`` gives a spot instance
EC2's own interruption notice (the instance-action and rebalance metadata the
agent watches) and interrupts it when ``durationBeforeInterruption`` is over:
the market's path, on purpose. An experiment runs from a template, so each
drill creates a one-target template, starts it, and deletes the template (a
started experiment keeps its own copy). FIS acts as the role
``[providers.aws] fis_role_arn`` names, which needs
``ec2:SendSpotInstanceInterruptions`` on the instances (the managed policy
``AWSFaultInjectionSimulatorEC2Access`` has it); the daemon needs
``fis:CreateExperimentTemplate``, ``fis:StartExperiment``,
``fis:DeleteExperimentTemplate``, ``fis:TagResource`` and ``iam:PassRole`` on
that role (docs/providers-aws.md).
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

from spotd.core.errors import InvalidRequestError, ProviderError
from spotd.core.values import CheckOutcome

from .clients import AwsClients
from .errors import PROVIDER, map_fis_errors
from .figures import NOTICE_SECONDS
from .settings import AwsSettings

log = logging.getLogger(__name__)

ACTION = "aws:ec2:send-spot-instance-interruptions"
"""FIS's action that interrupts spot instances with EC2's notice."""
TARGET = "SpotInstances"
"""The experiment's one target, by name."""
DRILL_TAG = "spotd-drill"
"""Tag on the template and the experiment: the instance drilled."""


def iso_minutes(seconds: int) -> str:
    """``seconds`` as an ISO 8601 duration of whole minutes (FIS's ``PT2M``), at least 2."""
    return f"PT{max(2, -(-seconds // 60))}M"


def instance_arn(caller_arn: str, account: str, region: str, instance_id: str) -> str:
    """The ARN of EC2 instance ``instance_id``, in the partition of the caller's ARN."""
    partition = caller_arn.split(":")[1] if caller_arn.startswith("arn:") else "aws"
    return f"arn:{partition}:ec2:{region}:{account}:instance/{instance_id}"


def template_params(role_arn: str, target_arn: str, instance_id: str) -> dict[str, Any]:
    """``CreateExperimentTemplate``'s parameters: interrupt the one instance ``target_arn``
    after EC2's notice, with no stop condition."""
    return {
        "clientToken": str(uuid.uuid4()),
        "description": f"spotd drill of {instance_id}",
        "roleArn": role_arn,
        "stopConditions": [{"source": "none"}],
        "targets": {TARGET: {"resourceType": "aws:ec2:spot-instance",
                             "resourceArns": [target_arn], "selectionMode": "ALL"}},
        "actions": {"interrupt": {
            "actionId": ACTION,
            "parameters": {"durationBeforeInterruption": iso_minutes(NOTICE_SECONDS)},
            "targets": {TARGET: TARGET},
        }},
        "tags": {DRILL_TAG: instance_id},
    }  # fmt: skip


def send_interruption(
    clients: AwsClients, settings: AwsSettings, region: str, instance_id: str
) -> str:
    """Have FIS interrupt spot instance ``instance_id`` of ``region``; the experiment's id.

    :class:`InvalidRequestError` when ``fis_role_arn`` is not set (no call is made);
    FIS's errors as :func:`~.errors.map_fis_errors` maps them.
    """
    role = settings.fis_role_arn
    if not role:
        raise InvalidRequestError(
            "aws drill: [providers.aws] fis_role_arn is not set: Fault Injection Service "
            "needs a role to interrupt the instance (docs/providers-aws.md, \"Drills\")",
            provider=PROVIDER, code="FisRoleArnMissing",
        )  # fmt: skip
    with map_fis_errors("GetCallerIdentity"):
        who = clients.sts(region).get_caller_identity()
    arn = instance_arn(str(who.get("Arn", "")), str(who.get("Account", "")), region, instance_id)
    fis = clients.fis(region)
    with map_fis_errors("CreateExperimentTemplate"):
        made = fis.create_experiment_template(**template_params(role, arn, instance_id))
    template = str(made["experimentTemplate"]["id"])
    try:
        with map_fis_errors("StartExperiment"):
            started = fis.start_experiment(
                clientToken=str(uuid.uuid4()), experimentTemplateId=template,
                tags={DRILL_TAG: instance_id},
            )  # fmt: skip
    finally:
        _delete_template(fis, template)
    return str(started["experiment"]["id"])


def _delete_template(fis: Any, template: str) -> None:
    """Delete a drill's template; one left behind is only logged (it costs nothing)."""
    try:
        with map_fis_errors("DeleteExperimentTemplate"):
            fis.delete_experiment_template(id=template)
    except ProviderError as exc:
        log.warning("aws: drill template %s not deleted: %s", template, exc)


def drill_check(settings: AwsSettings) -> CheckOutcome:
    """``check-cloud``'s line on drills: whether ``spotd drill`` has a role to act as.
    Drills are optional: a missing role is said, and passes."""
    if not settings.fis_role_arn:
        return CheckOutcome("drills", True, "providers.aws.fis_role_arn is not set: "
                            "`spotd drill` is refused on AWS")  # fmt: skip
    role = settings.fis_role_arn
    return CheckOutcome("drills", True, f"Fault Injection Service acts as {role} (the "
                        "daemon needs iam:PassRole on it)")  # fmt: skip
