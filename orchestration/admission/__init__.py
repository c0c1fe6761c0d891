"""Flow control on the database (docs/flow-control.md): the tenants' limits, the admission of
due calls at their start, and the reads of the engine's flow loop.

The rules themselves are pure (orchestration.flow); here they meet the rows. The start of
calls (orchestration.services.service_calls_start) calls `admit` inside its transaction, with
the candidate calls already locked: for each tenant with limits it locks the tenant's
flow_controls row (SKIP LOCKED: a start never waits for another cluster's), counts the
tenant's Running calls, reads the oldest held call of each of its queues (and the oldest due
calls that no start has decided yet), decides, moves the GCRA state, and marks the calls that
must wait as held. A held call stays Scheduled, its timer already Reached; the flow loop
(workers.loops.flow) starts it when there is room, through the same start.

Writes (flow_control_set, admit, release_held) run only inside orchestration's services;
everything else here only reads.

One module per part: `limits` (which tenants have limits, the limits in force, the service
that sets them), `held` (held calls and the index probes over them), `admit` (the start's
admission), `rounds` (the flow loop's reads). Import from `orchestration.admission`: the names
below are its public ones.
"""

from orchestration.admission.admit import admit, held_since_cleared_on_cancel, release_held
from orchestration.admission.held import MAX_QUEUES, UNDECIDED_SECONDS, any_held, held_count, held_ms_of
from orchestration.admission.limits import (
    LIMITED_CACHE_SECONDS,
    flow_control_set,
    flow_limits_effective,
    flow_limits_get,
    forget_limited_tenants,
    tenant_has_limits,
)
from orchestration.admission.rounds import FlowRound, flow_round

__all__ = [
    "LIMITED_CACHE_SECONDS",
    "MAX_QUEUES",
    "UNDECIDED_SECONDS",
    "FlowRound",
    "admit",
    "any_held",
    "flow_control_set",
    "flow_limits_effective",
    "flow_limits_get",
    "flow_round",
    "forget_limited_tenants",
    "held_count",
    "held_ms_of",
    "held_since_cleared_on_cancel",
    "release_held",
    "tenant_has_limits",
]
