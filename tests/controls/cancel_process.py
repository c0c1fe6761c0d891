"""A separate process that cancels calls at given instants by calling the service itself
(orchestration.services.service_call_cancel), for tests/controls/test_cancel_race.py.

Run as `python -m tests.controls.cancel_process` with the agent's environment (DATABASE_URL,
DJANGO_SETTINGS_MODULE). It prints `ready` once Django is set up, then reads one JSON line
`{"threads": n, "cancels": [[fire_at (epoch seconds), tenant, call id], ...]}`, sends each
cancel at its instant, and prints one JSON line: `[[call id, status, detail, seconds], ...]`
where status is what the API would answer (200, 404, 409; 500 for anything unexpected).
"""

from __future__ import annotations

import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor


def main() -> None:
    import django

    django.setup()
    from django.db import connection

    from core.errors import Conflict, NotFound
    from orchestration.services import service_call_cancel

    def cancel(fire_at: float, tenant_id: str, call_id: str) -> list:
        delay = fire_at - time.time()
        if delay > 0:
            time.sleep(delay)
        sent = time.monotonic()
        try:
            call = service_call_cancel(tenant_id=tenant_id, service_call_id=call_id, correlation_id="race")
            answer = [call_id, 200, call.status]
        except Conflict as exc:
            answer = [call_id, 409, str(exc)]
        except NotFound as exc:
            answer = [call_id, 404, str(exc)]
        except Exception as exc:  # reported to the test, which fails on it
            answer = [call_id, 500, f"{type(exc).__name__}: {exc}"]
            connection.close()  # a broken connection is not reused by this thread's next cancel
        return [*answer, time.monotonic() - sent]

    print("ready", flush=True)
    plan = json.loads(sys.stdin.readline())
    with ThreadPoolExecutor(plan["threads"]) as pool:
        results = list(pool.map(lambda item: cancel(*item), sorted(plan["cancels"])))
    print(json.dumps(results), flush=True)


if __name__ == "__main__":
    main()
