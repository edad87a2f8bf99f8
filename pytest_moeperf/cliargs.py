"""Argument checks shared by the ``moeperf`` subcommands: an input a command cannot use is an argparse usage error
(exit status 2, one line naming the option), not a traceback or a silently changed meaning."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

__all__ = ["at_least", "describe", "file_problem", "http_url", "input_file", "number_in", "output_path",
           "pvalue"]


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
