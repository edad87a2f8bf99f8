"""A history target as the user writes it (a SQLite path, ``sqlite:///PATH``, a ``postgresql://`` URL, or ``off``),
and how it is shown: never with a password, nor with any fragment of one.

`redact` is the target for messages: the password of the user information and of the query replaced by ``***``.
A URL that is not well formed (an ``@``, ``/`` or ``?`` in the password, a bad percent escape, an open ``[``) hides
everything from the user's ``:`` to the last ``@``, and a query value of a password key up to the next key, since
no one can tell where the password the user meant ends. `scrub` cleans a database driver's error text, which quotes
what it failed to parse: the target itself, each reading of each password (raw and percent-decoded), any run of
`FRAGMENT` or more characters of one, and any quoted token that is a piece of one become ``***``, even where a
password is also a common word.
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

OFF = ("off", "none", "no", "false", "0")
HIDDEN = "***"
FRAGMENT = 3  # the shortest run of a password's characters that `scrub` hides wherever it stands

_SECRET_KEY = re.compile("pass|secret|token", re.IGNORECASE)  # password=, sslpassword=, passfile=, …
# RFC 3986's characters of each part; a URL made of anything else is read as malformed (see the module docstring)
_WELL_FORMED = re.compile(r"(?P<user>[\w.~!$&'()*+,;=%-]*(?::[\w.~!$&'()*+,;=%-]*)?@)?"
                          r"(?P<hosts>(?:\[[0-9A-Fa-f:.]+\]|[\w.~!$&'()*+;=%-])*(?::\d*)?"
                          r"(?:,(?:\[[0-9A-Fa-f:.]+\]|[\w.~!$&'()*+;=%-])*(?::\d*)?)*)"
                          r"(?P<path>/[^?#@\[\]]*)?(?:\?(?P<query>[^#\[\]]*))?", re.ASCII)
_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")


def is_postgresql(target: str) -> bool:
    return target.startswith(("postgresql://", "postgres://"))


def sqlite_path(target: str) -> Path:
    """A SQLite target is a path or a URL as SQLAlchemy spells it: ``sqlite:///relative`` or ``sqlite:////absolute``."""
    return Path(target.removeprefix("sqlite:///"))


def parse_target(text: str) -> str | None:
    """``--moeperf-history``: a PostgreSQL URL, a SQLite path (or ``sqlite:///path``), or ``off`` (None)."""
    value = text.strip()
    if value.lower() in OFF:
        return None
    if "://" in value and not (is_postgresql(value) or value.startswith("sqlite:///")):
        raise ValueError(f"expected a SQLite path, sqlite:///PATH, postgresql://… or off, got {redact(value)!r}")
    return value


def _well_formed(rest: str) -> bool:
    return _WELL_FORMED.fullmatch(rest) is not None and _BAD_ESCAPE.search(rest) is None


def _userinfo_end(rest: str, well_formed: bool) -> int:
    """Where the user information ends (its ``@``), -1 when there is none: libpq's reading (the first ``@`` before
    any ``/``) when the URL is well formed, else the last ``@`` of all."""
    if well_formed:
        found = re.match(r"[^@/]*@", rest)
        return -1 if found is None else found.end() - 1
    return rest.rfind("@")


def _query_secrets(query: str) -> tuple[str, list[str]]:
    """The query shown and the values of its password keys. A part without ``=`` after a password key is read as
    the rest of that value (an ``&`` in a password that was not percent-encoded), so it is hidden too."""
    shown: list[str] = []
    secrets: list[str] = []
    inside = False
    for part in query.split("&"):
        key, equals, value = part.partition("=")
        if equals and _SECRET_KEY.search(unquote(key)):
            shown.append(f"{key}={HIDDEN}")
            secrets.append(value)
            inside = True
        elif inside and not equals:
            secrets[-1] += "&" + part
        else:
            shown.append(part)
            inside = False
    return "&".join(shown), secrets


def _split(target: str) -> tuple[str, list[str]]:
    """``(redacted target, every password it may hold)``."""
    if "://" not in target:
        return target, []
    scheme, _, rest = target.partition("://")
    well_formed = _well_formed(rest)
    secrets: list[str] = []
    end = _userinfo_end(rest, well_formed)
    if end >= 0:
        user, colon, password = rest[:end].partition(":")
        if colon:
            secrets.append(password)
        rest = f"{user}{':' + HIDDEN if colon else ''}{rest[end:]}"
    location, question, query = rest.partition("?")
    if question:
        query, found = _query_secrets(query)
        secrets += found
    return f"{scheme}://{location}{question}{query}", secrets


def redact(target: str) -> str:
    """The target with every password replaced, for messages: in the user information (``user:***@``) and in the
    query (``?password=***``, ``sslpassword=***``; a key libpq would decode from percent-encoding too)."""
    return _split(target)[0]


def secrets(target: str) -> list[str]:
    """Every password ``target`` holds, as written and percent-decoded, longest first."""
    found = {variant for secret in _split(target)[1] for variant in (secret, unquote(secret)) if variant}
    return sorted(found, key=lambda s: (-len(s), s))


def _hidden_spans(text: str, secret: str) -> list[tuple[int, int]]:
    """Every run of ``text`` that is a piece of ``secret`` at least `FRAGMENT` characters long (the whole of a
    shorter one), and every quoted token of ``text`` that is a piece of it."""
    spans: list[tuple[int, int]] = []
    shortest = min(FRAGMENT, len(secret))
    start = 0
    while start <= len(text) - shortest:
        stop = start
        while stop < len(text) and text[start:stop + 1] in secret:
            stop += 1
        if stop - start >= shortest:
            spans.append((start, stop))
            start = stop
        else:
            start += 1
    for quoted in re.finditer(r"\"([^\"]+)\"|'([^']+)'", text):
        token = quoted.group(1) or quoted.group(2)
        if token in secret:
            spans.append((quoted.start() + 1, quoted.end() - 1))
    return spans


def scrub(text: str, target: str) -> str:
    """``text`` (a driver's error about ``target``) with the target redacted and every password, every fragment of
    one and every quoted piece of one replaced by ``***``."""
    text = text.replace(target, redact(target)) if target else text
    for secret in secrets(target):
        text = text.replace(secret, HIDDEN)
        out: list[str] = []
        last = 0
        for start, stop in sorted(_hidden_spans(text, secret)):
            if out and start <= last:  # overlapping or touching the span before: extend it
                last = max(last, stop)
                continue
            out += [text[last:start], HIDDEN]
            last = stop
        text = "".join(out) + text[last:]
    return text
