"""Drills on Compute Engine (``spotd drill``): a simulated maintenance event on a Spot VM.

``instances.simulateMaintenanceEvent`` on a Spot VM preempts it as GCE's market
would: the ACPI soft off and ``instance/preempted`` metadata the agent watches,
about 30 seconds, then the VM stops (or is deleted, by its termination action),
with a ``compute.instances.preempted`` operation logged. It needs the permission
``compute.instances.simulateMaintenanceEvent`` (in ``roles/compute.instanceAdmin.v1``).
The call answers with a zonal operation, which is not waited for: the
preemption takes the notice's time, and the loop watches the VM as for any other.
"""

from __future__ import annotations

from google.cloud import compute_v1

from .clients import GcpClients
from .errors import map_gcp_errors, raise_for_operation


def simulate_preemption(clients: GcpClients, zone: str, name: str, *, timeout: float) -> None:
    """Ask GCE to run a maintenance event on Spot VM ``zone/name`` (it is preempted); raise
    the spotd error of a refused call, or of an operation that is done and failed."""
    request = compute_v1.SimulateMaintenanceEventInstanceRequest(
        project=clients.project, zone=zone, instance=name
    )
    with map_gcp_errors(f"simulate maintenance event on {zone}/{name}"):
        operation = clients.instances.simulate_maintenance_event_unary(
            request=request, retry=None, timeout=timeout
        )
    if operation.status == compute_v1.Operation.Status.DONE:
        raise_for_operation(operation)
