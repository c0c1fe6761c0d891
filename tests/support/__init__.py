"""Shared test support, imported by the tests (fixtures stay in the conftest.py files).

- `factories`: one factory per domain object (tenant, user, membership, API key, service
  call, outbox event), each going through the product's own services.
- `api`: the API's test client, URLs, a valid payload and the problem+json check.
- `targets`: the HTTP target on 127.0.0.1 behind the `http_target` fixture.
- `listeners`: raw-socket servers with scripted (often hostile) behaviours.
- `routes`: every route of the URLconf, filled with real ids of tenant acme's objects.
- `agent_process`: the agent as a real process (`manage.py`, gunicorn).
- `plans`: the SQL the product runs, recorded, and its query plan.
- `waiting`: `wait_for`, polling with a deadline.
"""
