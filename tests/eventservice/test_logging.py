"""The log lines (README, "Configuration": LOG_FORMAT, LOG_LEVEL, EVENT_LOG_LEVEL).

JSON by default, one object per line with the event as a nested object, never JSON encoded in a
string; text for a terminal, one short escaped line; published events off unless asked for.
"""

from __future__ import annotations

import json
import logging
import sys

from core.logging import ContextFilter, JsonFormatter, TextFormatter, log_context
from outbox.sinks import LogSink, event_log
from tests.support.agent_process import agent_env, manage

ENVELOPE = {
    "id": "01a20868-500f-78de-af07-f3b8e48794a5",
    "type": "ServiceCallSucceeded",
    "tenantId": "acme",
    "aggregateId": "01a20868-461a-7768-b328-c359c9cbfc4c",
    "timestampMs": 1_700_000_000_000,
    "correlationId": "01a20868-4619-7000-8000-000000000001",
    "causationId": None,
    "payload": {"serviceCallId": "01a20868-461a-7768-b328-c359c9cbfc4c", "status": 200, "body": '{"a": 1}'},
}


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def _published_event_record() -> logging.LogRecord:
    handler = _Records()
    level = event_log.level
    event_log.addHandler(handler)
    event_log.setLevel(logging.INFO)
    try:
        LogSink().publish([ENVELOPE])
    finally:
        event_log.removeHandler(handler)
        event_log.setLevel(level)
    [record] = handler.records
    return record


def test_an_event_is_one_json_object_with_the_envelope_nested_not_encoded_in_a_string():
    entry = json.loads(JsonFormatter().format(_published_event_record()))

    assert entry["msg"] == "ServiceCallSucceeded"
    assert entry["event"] == ENVELOPE  # an object, as published
    assert (entry["tenantId"], entry["serviceCallId"], entry["correlationId"]) == (
        "acme",
        ENVELOPE["aggregateId"],
        ENVELOPE["correlationId"],
    )
    for key, value in entry.items():
        assert not (isinstance(value, str) and value.startswith(("{", "["))), key


def test_an_event_as_text_is_one_short_line_with_its_ids_and_without_the_payload():
    line = TextFormatter().format(_published_event_record())

    assert "\n" not in line and "{" not in line
    assert " INFO serviceagent.events ServiceCallSucceeded tenantId=acme " in line
    assert f"serviceCallId={ENVELOPE['aggregateId']} correlationId={ENVELOPE['correlationId']}" in line


def test_a_text_line_carries_the_context_first_and_escapes_what_could_forge_a_line():
    logger = logging.getLogger("serviceagent.test")
    record = logger.makeRecord(
        logger.name,
        logging.WARNING,
        __file__,
        1,
        "refused %s",
        ("evil\n2026-01-01 00:00:00 ERROR forged\x1b[31m",),
        None,
        extra={"reason": "two words", "kind": "caf\u00e9\ud800", "count": 3, "detail": {"a": 1}, "tenantId": "acme"},
    )
    with log_context(correlationId="c-1"):
        ContextFilter().filter(record)  # what the console handler does

    line = TextFormatter().format(record)

    assert line.count("\n") == 0
    assert " WARNING serviceagent.test refused evil\\n2026-01-01 00:00:00 ERROR forged\\x1b[31m " in line
    # The context first; `detail`, not a simple value, is left to the JSON format.
    expected = 'tenantId=acme correlationId=c-1 reason="two words" kind="caf\\u00e9\\ud800" count=3'
    assert line.endswith(expected), line


def test_a_traceback_in_a_text_line_is_indented_under_its_record():
    try:
        raise ValueError("bad\nworse")
    except ValueError:
        record = logging.getLogger("x").makeRecord("x", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())

    first, *rest = TextFormatter().format(record).split("\n")

    assert first.endswith(" ERROR x failed")
    assert rest and all(line.startswith("    ") for line in rest)


def _configured(tmp_path, **env: str) -> str:
    """What the real settings configure: a record of each logger, as the process writes it."""
    environment = agent_env(tmp_path, SECRET_KEY="k" * 50, **env)
    for name in ("LOG_LEVEL", "EVENT_LOG_LEVEL", "LOG_FORMAT"):
        if name not in env:
            environment.pop(name, None)
    script = (
        "import logging; from core.logging import log_context\n"
        "with log_context(tenantId='acme', serviceCallId='sc-1', correlationId='c-1'):\n"
        "    logging.getLogger('serviceagent.pipeline').info('attempt finished', extra={'status': 200})\n"
        "    logging.getLogger('serviceagent.events').info('ServiceCallSucceeded', extra={'event': {'a': 1}})\n"
    )
    result = manage(environment, "shell", "--no-imports", "-c", script)
    assert result.returncode == 0, result.stderr
    return result.stderr


def test_by_default_lines_are_json_and_events_are_not_logged(tmp_path):
    [line] = _configured(tmp_path).splitlines()

    entry = json.loads(line)
    assert (entry["logger"], entry["msg"], entry["status"]) == ("serviceagent.pipeline", "attempt finished", 200)
    assert (entry["tenantId"], entry["serviceCallId"], entry["correlationId"]) == ("acme", "sc-1", "c-1")


def test_event_log_level_info_logs_the_events_and_log_format_text_writes_text(tmp_path):
    lines = _configured(tmp_path, EVENT_LOG_LEVEL="info", LOG_FORMAT="TEXT").splitlines()

    assert len(lines) == 2
    assert lines[0].endswith(
        " INFO serviceagent.pipeline attempt finished tenantId=acme serviceCallId=sc-1 correlationId=c-1 status=200"
    )
    assert lines[1].endswith(
        " INFO serviceagent.events ServiceCallSucceeded tenantId=acme serviceCallId=sc-1 correlationId=c-1"
    )


def test_a_text_message_that_looks_like_fields_is_quoted():
    import logging as stdlib_logging

    from core.logging import TextFormatter

    record = stdlib_logging.makeLogRecord({"msg": "renamed to x tenantId=victim", "levelname": "INFO", "name": "t"})
    record.tenantId = "acme"
    line = TextFormatter().format(record)
    assert '"renamed to x tenantId=victim"' in line and line.endswith("tenantId=acme")
