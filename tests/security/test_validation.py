"""validate_submission(): every limit of docs/security.md §1, at and just past each boundary.

The function is shared by the API, the pages and the commands, so these cases hold at every
edge; the edges' own tests check that a refusal there stores nothing.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from core.errors import ValidationFailed
from orchestration.validation import (
    MAX_BODY_BYTES,
    MAX_BODY_DEPTH,
    MAX_DOCUMENT_DEPTH,
    json_value_error,
    nested_deeper_than,
    one_year_after,
    parse_due_at,
    validate_submission,
    validate_tags,
)
from tests.support.api import ApiClient, assert_problem, calls_url, stored_counts, valid_payload


def payload(**overrides):
    data = {"name": "Ping", "requestSpec": {"method": "GET", "url": "https://api.example.com/v1/ping"}}
    spec = overrides.pop("spec", {})
    data["requestSpec"] = {**data["requestSpec"], **spec}
    data.update(overrides)
    return data


def errors_of(data, **kwargs) -> dict[str, list[str]]:
    with pytest.raises(ValidationFailed) as caught:
        validate_submission(data, **kwargs)
    return caught.value.errors


def test_a_minimal_submission_is_cleaned_with_defaults(settings):
    submission = validate_submission(payload())
    assert (submission.name, submission.method, submission.url) == ("Ping", "GET", "https://api.example.com/v1/ping")
    assert (submission.headers, submission.body, submission.tags) == ({}, None, [])
    assert submission.timeout_ms == settings.EXECUTION_TIMEOUT_MS
    assert submission.due_at is None and submission.idempotency_key is None


@pytest.mark.parametrize("data", [None, [], "x", 1, True])
def test_it_refuses_a_body_that_is_not_an_object(data):
    assert errors_of(data) == {"body": ["The request body must be a JSON object."]}


def test_it_reports_every_invalid_field_at_once():
    errors = errors_of({"name": "", "requestSpec": {"method": "TRACE", "url": "ftp://x"}, "tags": "a", "dueAt": 5})
    assert set(errors) == {"name", "requestSpec.method", "requestSpec.url", "tags", "dueAt"}


def test_it_refuses_unknown_fields():
    assert "body" in errors_of(payload(extra=1))
    assert "requestSpec" in errors_of(payload(spec={"follow": True}))


# --- name -----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["x", "a" * 200, "  padded  ", "Ünïcødé ✓", "tab\u00a0nbsp"])
def test_it_accepts_names_of_1_to_200_characters(name):
    assert validate_submission(payload(name=name)).name == name.strip()


@pytest.mark.parametrize(
    ("name", "message"),
    [
        (None, "A name is required."),
        ("", "A name is required."),
        ("   ", "A name is required."),
        (5, "A name is required."),
        ("a" * 201, "The name must be at most 200 characters."),
        ("line\nbreak", "The name must not contain control characters (U+000A)."),
        ("nul\x00", "name contains a NUL character (U+0000), which cannot be stored."),
        ("del\x7f", "The name must not contain control characters (U+007F)."),
        ("nel\x85line", "The name must not contain control characters (U+0085)."),
        ("csi\x9b31m", "The name must not contain control characters (U+009B)."),
        (
            "invoice-\u202efdp.exe",
            "The name must not contain invisible formatting characters (U+202E): they change how it is displayed.",
        ),
        (
            "admin\u200b",
            "The name must not contain invisible formatting characters (U+200B): they change how it is displayed.",
        ),
        (
            "isolate\u2066x\u2069",
            "The name must not contain invisible formatting characters (U+2066): they change how it is displayed.",
        ),
        ("surrogate\ud800", "name contains a lone UTF-16 surrogate (U+D800): it is not valid Unicode text."),
    ],
)
def test_it_refuses_bad_names(name, message):
    assert errors_of(payload(name=name))["name"] == [message]


# --- method ---------------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["GET", "POST", "PUT", "PATCH", "DELETE", "get", "Post"])
def test_it_accepts_the_five_methods_in_any_case(method):
    assert validate_submission(payload(spec={"method": method})).method == method.upper()


@pytest.mark.parametrize("method", ["HEAD", "OPTIONS", "TRACE", "CONNECT", "", None, 1, ["GET"]])
def test_it_refuses_other_methods(method):
    assert "requestSpec.method" in errors_of(payload(spec={"method": method}))


# --- url ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "http://example.com",
        "https://example.com:8443/a/b?c=d#frag",
        "http://sub.example.co.uk/",
        "http://8.8.8.8/",
        "http://[2606:4700:4700::1111]/",
        "https://bücher.example/",
        "http://under_score.example/",
        "http://example.com./",
        "https://example.com/" + "p" * (2048 - len("https://example.com/")),
    ],
)
def test_it_accepts_absolute_http_urls_up_to_2048_characters(url):
    assert validate_submission(payload(spec={"url": url})).url == url


@pytest.mark.parametrize(
    ("url", "fragment"),
    [
        (None, "required"),
        ("", "required"),
        (42, "required"),
        ("https://example.com/" + "p" * (2049 - len("https://example.com/")), "longer than 2048"),
        ("/relative/path", "absolute"),
        ("example.com/path", "absolute"),
        ("ftp://example.com/", "absolute"),
        ("file:///etc/passwd", "absolute"),
        ("javascript:alert(1)", "absolute"),
        ("gopher://x/", "absolute"),
        ("http://", "name a host"),
        ("http:///path", "name a host"),
        ("http://exa mple.com/", "whitespace"),
        ("http://example.com/\r\nHost: evil", "whitespace"),
        ("http://example.com/\x00", "NUL"),
        ("http://example.com\\@127.0.0.1/", "backslash"),
        ("http://user:pw@example.com/", "credentials"),
        ("http://user@example.com/", "credentials"),
        ("http://example.com:0/", "port"),
        ("http://example.com:65536/", "malformed"),
        ("http://example.com:port/", "malformed"),
        ("http://[::1/", "malformed"),
        ("http://-bad-.example/", "not a valid host"),
        ("http://a..b/", "not a valid host"),
        ("http://*.example.com/", "not valid"),
        ("http://１２７.０.０.１/", "not valid"),
        ("http://" + "a" * 254 + "/", "not a valid host"),
        ("http://ex%ample.com/", "not valid"),
        ("http://ex\ud800ample.com/", "Unicode"),
    ],
)
def test_it_refuses_bad_urls(url, fragment):
    [message] = errors_of(payload(spec={"url": url}))["requestSpec.url"]
    assert fragment in message


@pytest.mark.parametrize(
    "url",
    [
        "http://10.0.0.1/",
        "http://169.254.169.254/latest/meta-data/",
        "http://100.64.0.1/",
        "http://[fd00::1]/",
        "http://0xa9fea9fe/",
        "http://2852039166/",
        "http://[::ffff:192.168.0.1]/",
        "http://0/",
        "http://[::]/",
    ],
)
def test_it_refuses_an_ip_literal_the_egress_policy_refuses(url, settings):
    settings.EGRESS_ALLOWLIST = []
    settings.AGENT_BASE_URL = "http://agent.example.test:8000"
    [message] = errors_of(payload(spec={"url": url}))["requestSpec.url"]
    assert message.startswith("The URL is refused by the egress policy:")


def test_an_allowed_literal_and_the_agents_own_mock_target_pass(settings):
    settings.EGRESS_ALLOWLIST = ["10.1.0.0/16"]
    settings.AGENT_BASE_URL = "http://127.0.0.1:8000"
    validate_submission(payload(spec={"url": "http://10.1.2.3/"}))
    validate_submission(payload(spec={"url": "http://127.0.0.1:8000/mock/echo"}))
    assert "requestSpec.url" in errors_of(payload(spec={"url": "http://127.0.0.1:8001/"}))


def test_a_host_name_is_not_judged_at_submission(settings):
    settings.EGRESS_ALLOWLIST = []
    # It may resolve elsewhere by the time the call runs: execution judges it then.
    validate_submission(payload(spec={"url": "http://localhost:9/"}))


# --- headers --------------------------------------------------------------------------------


def test_it_accepts_up_to_50_token_named_headers():
    headers = {f"X-H{i}": f"v{i}" for i in range(50)}
    assert validate_submission(payload(spec={"headers": headers})).headers == headers


def test_it_refuses_more_than_50_headers():
    headers = {f"X-H{i}": "v" for i in range(51)}
    assert errors_of(payload(spec={"headers": headers}))["requestSpec.headers"] == ["At most 50 headers are allowed."]


@pytest.mark.parametrize(
    "name",
    [
        "",
        "Bad Name",
        "Bad:Name",
        "Bad\nName",
        "X-Trailing\n",
        "Ümlaut",
        "(comment)",
        "a/b",
        "a@b",
        "[x]",
        "X-Tab\t",
    ],
)
def test_it_refuses_header_names_that_are_not_tokens(name):
    [message] = errors_of(payload(spec={"headers": {name: "v"}}))["requestSpec.headers"]
    assert "not a valid token" in message or "non-empty" in message


@pytest.mark.parametrize(
    "name",
    [
        "Host",
        "host",
        "Content-Length",
        "Transfer-Encoding",
        "Connection",
        "Keep-Alive",
        "TE",
        "Trailer",
        "Trailers",
        "Upgrade",
        "Proxy-Authorization",
        "Proxy-Connection",
        "Proxy-Authenticate",
        "proxy-x",
    ],
)
def test_it_refuses_hop_by_hop_and_agent_owned_headers(name):
    [message] = errors_of(payload(spec={"headers": {name: "v"}}))["requestSpec.headers"]
    assert "set by the agent" in message


@pytest.mark.parametrize(
    "name",
    [
        "X_Service_Call_Id",
        "x_service_call_attempt",
        "X-Service_Call-Id",
        "Content_Length",
        "Transfer_Encoding",
        "Proxy_Authorization",
    ],
)
def test_it_refuses_agent_owned_headers_spelt_with_underscores(name):
    """WSGI servers fold "_" and "-" alike (both are HTTP_X_SERVICE_CALL_ID): a receiver would
    merge the tenant's X_Service_Call_Id with the agent's X-Service-Call-Id."""
    [message] = errors_of(payload(spec={"headers": {name: "v"}}))["requestSpec.headers"]
    assert "set by the agent" in message


def test_it_refuses_a_header_given_twice_as_dash_and_underscore():
    [message] = errors_of(payload(spec={"headers": {"X-Tenant-Ref": "1", "x_tenant_ref": "2"}}))["requestSpec.headers"]
    assert "given twice" in message


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("a\r\nInjected: yes", "CR, LF or NUL"),
        ("a\nb", "CR, LF or NUL"),
        ("a\rb", "CR, LF or NUL"),
        ("a\x00b", "NUL"),
        ("a\x01b", "control"),
        ("a\x7fb", "control"),
        ("a\x85b", "control characters (U+0085)"),
        ("a\x9bb", "control characters (U+009B)"),
        ("snow ☃", "Latin-1"),
        ("x" * 8193, "longer than 8192"),
        (5, "string value"),
        (None, "string value"),
        (["a"], "string value"),
    ],
)
def test_it_refuses_header_values_with_cr_lf_or_control_characters(value, fragment):
    [message] = errors_of(payload(spec={"headers": {"X-Value": value}}))["requestSpec.headers"]
    assert fragment in message


def test_header_values_keep_tabs_and_latin1_and_lose_surrounding_spaces():
    headers = {"X-A": "  a\tb  ", "X-B": "café", "X-C": "", "X-D": "non\u00a0breaking"}
    submission = validate_submission(payload(spec={"headers": headers}))
    assert submission.headers == {"X-A": "a\tb", "X-B": "café", "X-C": "", "X-D": "non\u00a0breaking"}


def test_it_refuses_a_header_given_twice_in_different_case():
    [message] = errors_of(payload(spec={"headers": {"X-A": "1", "x-a": "2"}}))["requestSpec.headers"]
    assert "given twice" in message


@pytest.mark.parametrize("headers", [[], "X-A: 1", 5, [["X-A", "1"]]])
def test_it_refuses_headers_that_are_not_an_object(headers):
    assert errors_of(payload(spec={"headers": headers}))["requestSpec.headers"] == [
        "headers must be an object of strings."
    ]


def test_null_headers_mean_none():
    assert validate_submission(payload(spec={"headers": None})).headers == {}


# --- body -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    ["", "plain text", {"a": [1, 2, {"b": None}]}, [1, "two"], 3.5, 0, True, False, "x" * MAX_BODY_BYTES],
)
def test_it_accepts_a_string_or_any_json_value_up_to_256_kib(body):
    assert validate_submission(payload(spec={"method": "POST", "body": body})).body == body


@pytest.mark.parametrize(
    "body",
    ["x" * (MAX_BODY_BYTES + 1), "é" * (MAX_BODY_BYTES // 2 + 1), {"k": "x" * MAX_BODY_BYTES}],
)
def test_it_refuses_a_body_over_256_kib_counted_in_bytes(body):
    assert errors_of(payload(spec={"method": "POST", "body": body}))["requestSpec.body"] == [
        "The body is larger than 256 KiB."
    ]


@pytest.mark.parametrize("body", [float("nan"), {"x": float("inf")}, {1, 2}, object(), "lone \udc00 surrogate"])
def test_it_refuses_a_body_that_is_not_text_or_json(body):
    assert "requestSpec.body" in errors_of(payload(spec={"method": "POST", "body": body}))


def _nested(depth, leaf="x"):
    for _ in range(depth):
        leaf = [leaf]
    return leaf


def test_any_valid_text_passes_in_a_body_including_characters_beyond_the_bmp():
    # "\ud83d\ude00" in JSON is one character once decoded: only a lone half is refused.
    body = {"emoji": json.loads('"\\ud83d\\ude00"'), "ünïcødé ✓": ["\u00a0", "\ufffd", "\uffff"], "tab": "\t"}
    assert validate_submission(payload(spec={"method": "POST", "body": body})).body == body


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("\ud800", "requestSpec.body contains a lone UTF-16 surrogate (U+D800): it is not valid Unicode text."),
        ({"a": {"b": ["x", "\udfff"]}}, "requestSpec.body.a.b[1] contains a lone UTF-16 surrogate (U+DFFF): it"),
        ({"a": [{"k\udc00": 1}]}, "A key in requestSpec.body.a[0] contains a lone UTF-16 surrogate (U+DC00)"),
        ({"a b": "\x00"}, 'requestSpec.body["a b"] contains a NUL character (U+0000), which cannot be stored.'),
        ([{"\x00": 1}], "A key in requestSpec.body[0] contains a NUL character (U+0000)"),
        (_nested(MAX_BODY_DEPTH, _nested(MAX_BODY_DEPTH)), f"requestSpec.body is nested deeper than {MAX_BODY_DEPTH}"),
    ],
    ids=["text", "in-lists", "key", "nul", "nul-key", "deep"],
)
def test_it_refuses_nul_lone_surrogates_and_deep_nesting_anywhere_in_a_body(body, message):
    [error] = errors_of(payload(spec={"method": "POST", "body": body}))["requestSpec.body"]
    assert error.startswith(message)


def test_a_body_may_nest_64_levels_and_no_more():
    assert validate_submission(payload(spec={"method": "POST", "body": _nested(MAX_BODY_DEPTH)})).body
    assert "requestSpec.body" in errors_of(payload(spec={"method": "POST", "body": _nested(MAX_BODY_DEPTH + 1)}))


@pytest.mark.parametrize("depth", [MAX_BODY_DEPTH + 1, 5_000])
def test_the_nesting_check_itself_never_recurses(depth):
    # 5,000 levels: deeper than any recursive walk (or repr) could go.
    assert json_value_error(_nested(depth), where="v") == f"v is nested deeper than {MAX_BODY_DEPTH} levels."
    assert nested_deeper_than(_nested(depth), MAX_DOCUMENT_DEPTH) == (depth > MAX_DOCUMENT_DEPTH)


# --- timeoutMs ------------------------------------------------------------------------------


@pytest.mark.parametrize("timeout", [1, 30_000, 120_000])
def test_it_accepts_timeouts_from_1_to_120000_ms(timeout):
    assert validate_submission(payload(spec={"timeoutMs": timeout})).timeout_ms == timeout


@pytest.mark.parametrize("timeout", [0, -1, 120_001, 1.5, "1000", True, None])
def test_it_refuses_other_timeouts(timeout):
    assert "requestSpec.timeoutMs" in errors_of(payload(spec={"timeoutMs": timeout}))


# --- tags -----------------------------------------------------------------------------------


def test_it_accepts_up_to_20_tags_of_1_to_64_characters_deduplicated():
    tags = [f"t{i}" for i in range(19)] + ["x" * 64, "t0"]
    assert validate_submission(payload(tags=tags)).tags == [f"t{i}" for i in range(19)] + ["x" * 64]


def test_it_refuses_more_than_20_distinct_tags():
    assert errors_of(payload(tags=[f"t{i}" for i in range(21)]))["tags"] == ["At most 20 tags are allowed."]


@pytest.mark.parametrize(
    "tag",
    [
        "",
        "x" * 65,
        "two words",
        "tab\there",
        "new\nline",
        "trailing\n",
        "nbsp\u00a0x",
        "\x00",
        5,
        None,
        ["a"],
        "lone\ud800",
        "nel\x85x",
    ],
)
def test_it_refuses_tags_that_are_empty_long_or_contain_whitespace(tag):
    assert "tags" in errors_of(payload(tags=[tag]))


@pytest.mark.parametrize(("tag", "code"), [("c1\x80x", "U+0080"), ("rlo\u202ex", "U+202E"), ("zw\u200bsp", "U+200B")])
def test_it_refuses_tags_with_c1_controls_or_invisible_formatting_characters(tag, code):
    [message] = errors_of(payload(tags=[tag]))["tags"]
    assert f"must not contain control or invisible formatting characters ({code})" in message
    with pytest.raises(ValidationFailed):
        validate_tags([tag])


@pytest.mark.parametrize("tags", ["a,b", {"a": 1}, 3])
def test_it_refuses_tags_that_are_not_a_list(tags):
    assert errors_of(payload(tags=tags))["tags"] == ["Tags must be a list of strings."]


def test_tags_replaced_later_are_validated_the_same_way():
    assert validate_tags(["a", "b", "a"]) == ["a", "b"]
    assert validate_tags([]) == []
    for bad in (["bad tag"], None, "a", {"a": 1}):
        with pytest.raises(ValidationFailed):
            validate_tags(bad)


# --- dueAt ----------------------------------------------------------------------------------

NOW = datetime(2030, 3, 10, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("2030-03-10T13:00:00Z", datetime(2030, 3, 10, 13, 0, tzinfo=UTC)),
        ("2030-03-10T13:00:00z", datetime(2030, 3, 10, 13, 0, tzinfo=UTC)),
        ("2030-03-10T15:00:00+02:00", datetime(2030, 3, 10, 13, 0, tzinfo=UTC)),
        ("2030-03-10T13:00:00.123456-05:30", datetime(2030, 3, 10, 18, 30, 0, 123456, tzinfo=UTC)),
        ("2031-03-10T12:00:00Z", datetime(2031, 3, 10, 12, 0, tzinfo=UTC)),  # exactly one year ahead
        ("2001-01-01T00:00:00Z", datetime(2001, 1, 1, tzinfo=UTC)),  # past: runs now
        (None, None),
    ],
)
def test_it_reads_due_times_with_a_zone_up_to_one_year_ahead(value, expected):
    assert parse_due_at(value, now=NOW) == expected


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("2030-03-10T13:00:00", "time zone"),
        ("2030-03-10", "time zone"),
        ("", "empty"),  # the schema's date-time: absent or null is now
        ("tomorrow", "not a valid"),
        ("2030-13-01T00:00:00Z", "not a valid"),
        ("2030-02-30T00:00:00Z", "not a valid"),
        ("2031-03-10T12:00:00.001Z", "one year"),
        ("9999-12-31T23:59:59-23:59", "one year"),
        (1234567890, "ISO 8601 string"),
        ({"at": 1}, "ISO 8601 string"),
        ("2030-03-10T13:00:00.000" + "0" * 50 + "Z", "not a valid"),
    ],
)
def test_it_refuses_due_times_without_a_zone_malformed_or_beyond_a_year(value, fragment):
    with pytest.raises(ValueError, match=fragment):
        parse_due_at(value, now=NOW)


def test_one_year_ahead_is_a_calendar_year_even_from_29_february():
    assert one_year_after(datetime(2028, 2, 29, 8, 0, tzinfo=UTC)) == datetime(2029, 2, 28, 8, 0, tzinfo=UTC)


def test_a_due_time_beyond_a_year_is_refused_in_a_submission():
    too_far = (datetime.now(UTC) + timedelta(days=367)).isoformat()
    assert errors_of(payload(dueAt=too_far))["dueAt"] == ["dueAt must be at most one year ahead."]


# --- idempotency key ------------------------------------------------------------------------


def test_it_takes_the_idempotency_key_from_the_body_or_the_header():
    assert validate_submission(payload(idempotencyKey="k-1")).idempotency_key == "k-1"
    assert validate_submission(payload(), idempotency_header="k-2").idempotency_key == "k-2"
    assert validate_submission(payload(idempotencyKey="k-3"), idempotency_header="k-3").idempotency_key == "k-3"


@pytest.mark.parametrize("key", ["", " ", "x" * 201, "with space", "tab\t", "nl\n", 5, "\ud800"])
def test_it_refuses_bad_idempotency_keys(key):
    assert "idempotencyKey" in errors_of(payload(idempotencyKey=key))


@pytest.mark.parametrize(
    ("key", "code"),
    [
        ("nbsp\u00a0x", "U+00A0"),
        ("ideographic\u3000space", "U+3000"),
        ("line\u2028separator", "U+2028"),
        ("nel\x85x", "U+0085"),
        ("c1\x9bx", "U+009B"),
        ("rlo\u202ex", "U+202E"),
        ("zero\u200bwidth", "U+200B"),
        ("bom\ufeff", "U+FEFF"),
    ],
)
def test_it_refuses_idempotency_keys_with_invisible_characters_in_the_body_or_the_header(key, code):
    message = (
        "idempotencyKey must be visible characters only: no whitespace, control or invisible formatting "
        f"characters ({code})."
    )
    assert errors_of(payload(idempotencyKey=key))["idempotencyKey"] == [message]
    assert errors_of(payload(), idempotency_header=key)["idempotencyKey"] == [message]


def test_visible_non_ascii_idempotency_keys_pass():
    assert validate_submission(payload(idempotencyKey="ключ-✓-1")).idempotency_key == "ключ-✓-1"


def test_it_refuses_a_body_key_that_differs_from_the_header():
    assert "idempotencyKey" in errors_of(payload(idempotencyKey="a"), idempotency_header="b")


# --- through the API --------------------------------------------------------------------------


def test_the_api_refuses_a_spoofing_name_and_an_invisible_idempotency_key_and_stores_nothing(world):
    api = ApiClient(world.acme_key)
    before = stored_counts()
    response = api.post(calls_url(), valid_payload(name="invoice-\u202efdp.exe"))
    assert "U+202E" in assert_problem(response, 400, errors_for="name")["errors"]["name"][0]
    response = api.post(calls_url(), valid_payload(), headers={"Idempotency-Key": "k\u00a01"})
    assert "U+00A0" in assert_problem(response, 400, errors_for="idempotencyKey")["errors"]["idempotencyKey"][0]
    response = api.post(calls_url(), valid_payload(spec={"headers": {"X-Note": "a\x85b"}}))
    assert (
        "U+0085" in assert_problem(response, 400, errors_for="requestSpec.headers")["errors"]["requestSpec.headers"][0]
    )
    assert stored_counts() == before
