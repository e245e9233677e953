"""What each cloud adapter's drill sends, beyond the contract suite: the real SDK calls
(AWS Fault Injection Service, GCE's simulated maintenance event, Azure's simulated
eviction) and their parameters, as the fakes received them, and the errors mapped."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import boto3
import pytest
from harnesses import Harness
from harnesses.aws import FIS_ROLE, REGION, AwsHarness
from harnesses.aws import make_harness as aws_harness
from harnesses.azure import make_harness as azure_harness
from harnesses.gcp import make_harness as gcp_harness

from spotd.core.errors import InvalidRequestError, QuotaError
from spotd.core.values import InstanceState, LaunchRequest, Market, Offering
from spotd.engine.settings import TAG_ATTEMPT, TAG_JOB, TAG_OWNER
from spotd_aws import AwsProvider
from spotd_aws.drill import ACTION, iso_minutes


def request(
    h: Harness, token: str, nodes: int = 1, offering: Offering | None = None
) -> LaunchRequest:
    return LaunchRequest(
        offering=offering or h.launchable(), market=Market.SPOT, nodes=nodes,
        client_token=token, tags={TAG_JOB: "j-drill", TAG_ATTEMPT: "1", TAG_OWNER: "drill"},
        command=h.command(), env={"SPOTD_JOB_ID": "j-drill"},
    )  # fmt: skip


def until(h: Harness, check: Callable[[], bool], timeout: float = 15.0) -> None:
    limit = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < limit, "condition never held"
        h.settle()


def running(h: Harness, ids: list[str]) -> None:
    def up() -> bool:
        found = h.provider.describe(ids)
        return len(found) == len(ids) and all(i.state is InstanceState.RUNNING for i in found)

    until(h, up)


# -- AWS: an experiment of Fault Injection Service --------------------------------------


def test_aws_drills_through_a_fis_experiment_on_the_one_instance(tmp_path: Path) -> None:
    with aws_harness(tmp_path) as h:
        (inst,) = h.provider.launch(request(h, "aws-drill"))
        running(h, [inst.id])
        h.provider.drill(inst.id)
        (made,) = h.fake.params("CreateExperimentTemplate")
        arn = f"arn:aws:ec2:{REGION}:123456789012:instance/{inst.id}"
        assert made["roleArn"] == FIS_ROLE
        assert made["stopConditions"] == [{"source": "none"}]
        assert made["targets"] == {"SpotInstances": {
            "resourceType": "aws:ec2:spot-instance", "resourceArns": [arn],
            "selectionMode": "ALL"}}  # fmt: skip
        (action,) = made["actions"].values()
        assert action["actionId"] == ACTION == "aws:ec2:send-spot-instance-interruptions"
        assert action["parameters"] == {"durationBeforeInterruption": "PT2M"}
        assert action["targets"] == {"SpotInstances": "SpotInstances"}
        (started,) = h.fake.params("StartExperiment")
        fis = boto3.client("fis", region_name=REGION)
        (experiment,) = fis.list_experiments()["experiments"]
        assert experiment["experimentTemplateId"] == started["experimentTemplateId"]
        # The template goes once the experiment runs (it keeps its own copy).
        assert fis.list_experiment_templates()["experimentTemplates"] == []
        (seen,) = h.provider.describe([inst.id])
        assert seen.state is InstanceState.PREEMPTED


def test_aws_refuses_a_drill_without_a_fis_role_and_calls_nothing(tmp_path: Path) -> None:
    with aws_harness(tmp_path) as h:
        roleless = _without_role(h)
        (inst,) = roleless.launch(request(h, "aws-roleless"))
        running(h, [inst.id])
        with pytest.raises(InvalidRequestError) as err:
            roleless.drill(inst.id)
        assert err.value.code == "FisRoleArnMissing" and err.value.provider == "aws"
        assert "fis_role_arn" in str(err.value)
        assert h.fake.params("CreateExperimentTemplate") == []


@pytest.mark.parametrize(("code", "status", "kind"), [
    ("ValidationException", 400, InvalidRequestError),
    ("ServiceQuotaExceededException", 402, QuotaError),
])  # fmt: skip
def test_aws_maps_fis_errors_to_our_classes(
    tmp_path: Path, code: str, status: int, kind: type[Exception]
) -> None:
    with aws_harness(tmp_path) as h:
        (inst,) = h.provider.launch(request(h, f"aws-{code}"))
        running(h, [inst.id])
        h.fake.fail_next("CreateExperimentTemplate", code, status)
        with pytest.raises(kind) as err:
            h.provider.drill(inst.id)
        assert getattr(err.value, "code", None) == code
        (seen,) = h.provider.describe([inst.id])
        assert seen.state is InstanceState.RUNNING


def test_aws_check_cloud_says_whether_drills_have_a_role(tmp_path: Path) -> None:
    with aws_harness(tmp_path) as h:
        with_role = {o.name: o for o in h.provider.check_cloud(None).outcomes}["drills"]
        without = {o.name: o for o in _without_role(h).check_cloud(None).outcomes}["drills"]
    assert with_role.ok and FIS_ROLE in with_role.detail
    assert without.ok and "fis_role_arn is not set" in without.detail


def test_fis_durations_are_whole_minutes_of_at_least_two() -> None:
    assert [iso_minutes(s) for s in (30, 120, 121, 900)] == ["PT2M", "PT2M", "PT3M", "PT15M"]


def _without_role(h: AwsHarness) -> AwsProvider:
    settings = h.settings.model_copy(update={"fis_role_arn": None})
    return AwsProvider(settings, user_data=lambda r: "#!/bin/sh\n",
                       clients=h.provider._clients)  # fmt: skip


# -- GCP: instances.simulateMaintenanceEvent ---------------------------------------------


def test_gcp_drills_by_a_simulated_maintenance_event(tmp_path: Path) -> None:
    with gcp_harness(tmp_path) as h:
        (inst,) = h.provider.launch(request(h, "gcp-drill"))
        running(h, [inst.id])
        h.provider.drill(inst.id)
        zone, name = inst.id.split("/", 1)
        (sent,) = h.fake.recorded("POST", "/simulateMaintenanceEvent")
        assert sent.path.endswith(f"/zones/{zone}/instances/{name}/simulateMaintenanceEvent")
        found = h.provider.describe([inst.id])
        assert [i.state for i in found] in ([InstanceState.PREEMPTED], [])


# -- Azure: simulateEviction, of a VM and of a scale set's VM -----------------------------


def test_azure_drills_a_vm_by_a_simulated_eviction(tmp_path: Path) -> None:
    with azure_harness(tmp_path) as h:
        (inst,) = h.provider.launch(request(h, "azure-drill"))
        running(h, [inst.id])
        h.provider.drill(inst.id)
        (sent,) = h.fake.requests_of("POST", "/simulateEviction")
        assert sent.path.endswith(f"/virtualMachines/{inst.id}/simulateEviction")
        assert [i.state for i in h.provider.describe([inst.id])] in (
            [InstanceState.PREEMPTED], [])  # fmt: skip


def test_azure_drills_a_scale_set_vm_through_the_scale_set(tmp_path: Path) -> None:
    with azure_harness(tmp_path) as h:
        gang = request(h, "azure-gang", nodes=2, offering=h.gang_offering())
        ids = [i.id for i in h.provider.launch(gang)]
        running(h, ids)
        h.provider.drill(ids[1])
        set_name, index = ids[1].rsplit("_", 1)
        (sent,) = h.fake.requests_of("POST", "/simulateEviction")
        assert sent.path.endswith(
            f"/virtualMachineScaleSets/{set_name}/virtualMachines/{index}/simulateEviction"
        )
        assert [i.state for i in h.provider.describe(ids[:1])] == [InstanceState.RUNNING]
