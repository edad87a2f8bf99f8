"""The one set of argument checks: the ``--moeperf-*`` option table and the ``moeperf`` subcommands parse with
these. An input that cannot be used is an argparse usage error (exit status 2, or a pytest usage error naming the
option or ini key), not a traceback or a silently changed meaning."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

from pytest_moeperf.judging.thresholds import MIN_RUNS_FOR_SPREAD, fraction_hint

__all__ = ["CONFIRM_AT", "at_least", "describe", "file_problem", "http_url", "input_file", "number_in", "output_path",
           "parse_bool", "parse_confirm_at", "parse_cores", "parse_count", "parse_factor", "parse_floor",
           "parse_fraction", "parse_name", "parse_noise_runs", "parse_percent", "parse_positive", "parse_seconds",
           "parse_starts", "pvalue"]


def at_least(low: int) -> Callable[[str], int]:
    """An ``int`` option that must be ``>= low``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {value}")
        return value

    return parse


def number_in(low: float, *, strict: bool = False) -> Callable[[str], float]:
    """A finite ``float`` option that must be ``>= low`` (``> low`` when ``strict``)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not math.isfinite(value) or value < low or (strict and value == low):
            raise argparse.ArgumentTypeError(f"must be a finite number {'>' if strict else '>='} {low:g}, "
                                             f"got {text}")
        return value

    return parse


def pvalue(text: str) -> float:
    """A significance level: ``0 < p <= 1``."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0 < value <= 1:  # also false for nan
        raise argparse.ArgumentTypeError(f"must be a probability in (0, 1], got {text}")
    return value


def http_url(text: str) -> str:
    """An ``http://`` or ``https://`` base URL with a host (and a valid port, if one is given)."""
    parts = urlsplit(text.strip())
    try:
        port_ok = parts.port is None or parts.port > 0
    except ValueError:
        port_ok = False
    if parts.scheme not in ("http", "https") or not parts.hostname or not port_ok:
        raise argparse.ArgumentTypeError(f"expected an http:// or https:// URL with a host (and port), got {text!r}")
    return text.strip()


def file_problem(path: Path) -> str | None:
    """Why ``path`` cannot be read as a file, or None."""
    if not path.exists():
        return f"{path} does not exist"
    if path.is_dir():
        return f"{path} is a directory, not a file"
    return None


def input_file(text: str) -> Path:
    """An existing file (not a directory)."""
    path = Path(text)
    problem = file_problem(path)
    if problem is not None:
        raise argparse.ArgumentTypeError(problem)
    return path


def output_path(text: str) -> Path:
    """A file to write: not a directory, and below no existing file (missing folders are created on writing)."""
    if not text:
        raise argparse.ArgumentTypeError("expected a file path, got ''")
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{path} is a directory; name a file in it")
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise argparse.ArgumentTypeError(f"cannot write {path}: {parent} is a file, not a directory")
            break
    return path


def describe(exc: BaseException) -> str:
    """One line for an error: its message (newlines folded), else its type's name."""
    text = str(exc)
    if isinstance(exc, KeyError) and exc.args and isinstance(exc.args[0], str):
        text = exc.args[0]
    elif isinstance(exc, OSError) and exc.strerror and text.startswith("[Errno"):
        text = f"{exc.filename}: {exc.strerror}" if exc.filename is not None else exc.strerror
    return " ".join(text.split()) or type(exc).__name__


def parse_fraction(text: str) -> float:
    """A relative threshold: a fraction in [0, 1) such as ``0.05``, or a percentage below 100 written with its
    sign, ``5%``. ``2`` is refused, naming the fraction it probably meant (`thresholds.fraction_hint`)."""
    stripped = text.strip()
    if stripped.endswith("%"):
        percent = number_in(0.0)(stripped[:-1])
        if percent >= 100.0:
            raise argparse.ArgumentTypeError(f"a percentage below 100 % is expected, got {text}")
        return percent / 100.0
    value = number_in(0.0)(stripped)
    hint = fraction_hint(value)
    if hint is not None:
        raise argparse.ArgumentTypeError(hint)
    return value


def parse_floor(text: str) -> float:
    """A fraction such as ``0.03``, or ``off``: infinity, a floor that is never below the minimum effect (None
    would read as "not given" and fall back to the default)."""
    return math.inf if text.strip().lower() in ("off", "none") else parse_fraction(text)


def parse_seconds(text: str) -> float:
    """A positive, finite number of seconds."""
    return number_in(0.0, strict=True)(text)


def parse_milliseconds(text: str) -> float:
    """A finite number of milliseconds >= 0."""
    return number_in(0.0)(text)


def parse_count(text: str) -> int:
    """An integer >= 0."""
    return at_least(0)(text)


def parse_positive(text: str) -> int:
    """An integer >= 1."""
    return at_least(1)(text)


def parse_noise_runs(text: str) -> int:
    """How many runs a baseline keeps per metric and host: at least the `MIN_RUNS_FOR_SPREAD` the judge learns a
    between-run spread from (fewer, and no verdict could ever be REGRESSED)."""
    value = at_least(1)(text)
    if value < MIN_RUNS_FOR_SPREAD:
        raise argparse.ArgumentTypeError(
            f"must be at least {MIN_RUNS_FOR_SPREAD}, got {value}: a baseline learns its between-run noise from "
            f"{MIN_RUNS_FOR_SPREAD} or more runs of a host, and with fewer kept it can never fail anything")
    return value


def parse_factor(text: str) -> float:
    """A finite multiplier >= 0, such as 3."""
    return number_in(0.0)(text)


def parse_percent(text: str) -> float:
    """A percentage in [0, 100]."""
    value = number_in(0.0)(text)
    if value > 100.0:
        raise argparse.ArgumentTypeError(f"a percentage is in [0, 100], got {text}")
    return value


def parse_cores(text: str) -> float | None:
    """A number of CPU cores >= 0, e.g. ``0.5``; ``auto`` (None): chosen from the CPUs this process may use."""
    return None if text.strip().lower() == "auto" else number_in(0.0)(text)


def parse_starts(text: str) -> int | None:
    """A number of server starts >= 1, or ``auto`` (None): chosen from the machine (`options.starts_of`)."""
    return None if text.strip().lower() == "auto" else at_least(1)(text)


def parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off", ""}:
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def parse_name(text: str) -> str:
    """A name for a file or a record: letters, digits, ``.``, ``_``, ``-``; 1 to 64 characters."""
    name = text.strip()
    if not name or len(name) > 64 or not all(c.isalnum() or c in "._-" for c in name):
        raise argparse.ArgumentTypeError(f"expected a name of letters, digits, '.', '_' and '-' (at most 64), "
                                         f"got {text!r}")
    return name


#: ``--moeperf-confirm-at`` values (`processes.confirm_at`)
CONFIRM_AT = ("end", "call")


def parse_confirm_at(text: str) -> str:
    """When a test is confirmed: ``end`` (the session's) or ``call`` (right after its call)."""
    name = text.strip().lower()
    if name not in CONFIRM_AT:
        raise argparse.ArgumentTypeError(f"expected {' or '.join(CONFIRM_AT)}, got {text!r}")
    return name


def parse_server_urls(text: str) -> tuple[str, ...]:
    """``URL`` or ``NAME=URL``, several separated by whitespace or commas (ini); each checked as a URL."""
    out = []
    for item in text.replace(",", " ").split():
        name, sep, url = item.rpartition("=") if "=" in item.split("://", 1)[0] else ("", "", item)
        out.append(f"{name}={http_url(url).rstrip('/')}" if sep else http_url(url).rstrip("/"))
    return tuple(out)


def parse_pids(text: str) -> tuple[int, ...]:
    """Process ids (integers >= 1), several separated by whitespace or commas (ini)."""
    return tuple(at_least(1)(item) for item in text.replace(",", " ").split())


def parse_paths(text: str) -> tuple[Path, ...]:
    """Paths or glob patterns, separated by whitespace (several ini lines too)."""
    return tuple(Path(p) for p in text.split())
