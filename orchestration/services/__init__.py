"""State transitions of service calls: the only code that writes service_calls and their tags.

Every transition is a conditional UPDATE inside one transaction with its outbox events, so a
duplicate message finds zero rows to change, and that is not an error (docs/architecture.md,
'The path of one call').

One module per subject: `submit`, `batch` (many submissions at once), `bulk` (an action on every call a filter matches), `start` (and the timers of skipped starts armed again),
`finish` (and retries), `cancel`, `tags`, `rerun`, `rotation` (secrets at rest); `calls` holds
what they share. Import from `orchestration.services`: the names below are its public ones.
"""

from orchestration.services.batch import BATCH_MAX, BatchResult, service_calls_submit_batch
from orchestration.services.bulk import BULK_MAX, BulkResult, bulk_calls_matched, service_calls_bulk
from orchestration.services.calls import EVENT_BODY_SNIPPET, CallKey, Occurrence, StartedCall, public_request_spec
from orchestration.services.cancel import service_call_cancel
from orchestration.services.finish import service_call_finish, service_call_interrupt, service_calls_finish
from orchestration.services.rerun import service_call_rerun
from orchestration.services.rotation import RotationResult, sealed_values_rotate
from orchestration.services.start import (
    FAIR_CANDIDATES,
    running_call_for_execution,
    service_call_start,
    service_calls_rearm_overdue,
    service_calls_start,
    service_calls_start_overdue,
)
from orchestration.services.submit import retry_policy_within_ceilings, service_call_submit
from orchestration.services.tags import service_call_favorite_set, service_call_tags_set

__all__ = [
    "BATCH_MAX",
    "BULK_MAX",
    "EVENT_BODY_SNIPPET",
    "FAIR_CANDIDATES",
    "BatchResult",
    "BulkResult",
    "bulk_calls_matched",
    "CallKey",
    "Occurrence",
    "RotationResult",
    "StartedCall",
    "public_request_spec",
    "retry_policy_within_ceilings",
    "running_call_for_execution",
    "sealed_values_rotate",
    "service_call_cancel",
    "service_call_favorite_set",
    "service_call_finish",
    "service_call_interrupt",
    "service_call_rerun",
    "service_call_start",
    "service_call_submit",
    "service_call_tags_set",
    "service_calls_finish",
    "service_calls_rearm_overdue",
    "service_calls_start",
    "service_calls_start_overdue",
    "service_calls_bulk",
    "service_calls_submit_batch",
]
