"""Rules for text that people read back: names and tags shown by the dashboard and the admin,
checked alike by every module that takes one (orchestration's calls, delivery's subscriptions)."""

from __future__ import annotations

import functools
import re
import unicodedata

# Unicode categories: Cc the control characters (C0, DEL and C1 such as NEL U+0085), Cf the
# invisible format characters (U+202E RIGHT-TO-LEFT OVERRIDE reverses the text shown after it,
# U+200B ZERO WIDTH SPACE hides a difference): in a name or tag they spoof what the dashboard
# and the admin display. Z* is whitespace, NBSP included.
CONTROL = frozenset({"Cc"})
INVISIBLE = frozenset({"Cc", "Cf"})
NOT_VISIBLE = frozenset({"Cc", "Cf", "Zs", "Zl", "Zp"})
# CONTROL as a regular expression's character class holds it (Cc is these three ranges).
CONTROL_CLASS = r"\u0000-\u001f\u007f-\u009f"


@functools.cache
def hidden_class() -> str:
    """The characters of INVISIBLE in the Basic Multilingual Plane as the ranges of a regular
    expression's character class (`\\u0000-\\u001f...`): what the OpenAPI schema's patterns
    leave out, so that a client's generator refuses what the server refuses."""
    ranges: list[list[int]] = []
    for cp in range(0x10000):
        if unicodedata.category(chr(cp)) in INVISIBLE:
            if ranges and ranges[-1][1] == cp - 1:
                ranges[-1][1] = cp
            else:
                ranges.append([cp, cp])
    return "".join(f"\\u{a:04x}" if a == b else f"\\u{a:04x}-\\u{b:04x}" for a, b in ranges)


# The patterns below say no length: an ECMAScript pattern without the `u` flag counts UTF-16
# units (an emoji is two), JSON Schema's maxLength counts characters, as the server does. Their
# fields give it as max_length.


def name_pattern() -> str:
    """A name as the OpenAPI schema says it: something visible, nothing INVISIBLE."""
    # [\s\S], not '.': ECMAScript's '.' stops at U+2028, which a name may hold.
    return rf"^(?=[\s\S]*\S)[^{hidden_class()}]+$"


def visible_pattern(*, also_refused: str = "") -> str:
    """Visible characters only, as the OpenAPI schema says it: no whitespace, nothing INVISIBLE,
    none of `also_refused` (characters as a regular expression's class holds them)."""
    return rf"^[^\s{also_refused}{hidden_class()}]+$"


def tag_pattern() -> str:
    """A tag as the OpenAPI schema says it: no whitespace, nothing INVISIBLE (1-MAX_TAG long)."""
    return visible_pattern()


def first_of(text: str, categories: frozenset[str], *, allowed: str = "") -> str | None:
    """The first character of `text` in one of the Unicode `categories`, or None."""
    return next((ch for ch in text if ch not in allowed and unicodedata.category(ch) in categories), None)


def name_problem(name: str) -> str | None:
    """Why `name` may not be shown as a name (a control or an invisible formatting character),
    or None."""
    if (ch := first_of(name, CONTROL)) is not None:
        return f"The name must not contain control characters (U+{ord(ch):04X})."
    if (ch := first_of(name, INVISIBLE)) is not None:
        return (
            f"The name must not contain invisible formatting characters (U+{ord(ch):04X}): "
            "they change how it is displayed."
        )
    return None


MAX_TAG = 64
MAX_TAGS = 20
_TAG_RE = re.compile(r"[^\s\x00-\x1f\x7f]{1,64}\Z")


def tag_problem(tag: object) -> str | None:
    """Why `tag` may not be a tag (of a call, or one a subscription filters by), or None."""
    if not isinstance(tag, str) or not _TAG_RE.match(tag):
        return f"Tag {str(tag)[:40]!r} must be 1-{MAX_TAG} characters without whitespace."
    if (ch := first_of(tag, INVISIBLE)) is not None:
        return f"Tag {tag[:40]!r} must not contain control or invisible formatting characters (U+{ord(ch):04X})."
    return None
