"""Pure parser for the Prometheus text exposition format (version 0.0.4).

Only what a scrape of vLLM's ``/metrics`` needs: ``# HELP`` / ``# TYPE`` comments and sample lines
``name{label="value",...} value [timestamp]``, with label-value escapes (``\\\\``, ``\\"``, ``\\n``) and
the special values ``NaN``, ``+Inf`` and ``-Inf``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

__all__ = ["PrometheusParseError", "Sample", "Scrape", "parse"]

_NAME_FIRST = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_:")
_NAME_REST = _NAME_FIRST | frozenset("0123456789")
_LABEL_FIRST = _NAME_FIRST - {":"}
_LABEL_REST = _LABEL_FIRST | frozenset("0123456789")
_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}


class PrometheusParseError(ValueError):
    """A line of the exposition could not be parsed; the message names the line number and column."""


@dataclass(frozen=True)
class Sample:
    """One sample line: metric name, its labels (sorted pairs) and value."""

    name: str
    labels: tuple[tuple[str, str], ...]
    value: float

    @property
    def label_map(self) -> dict[str, str]:
        return dict(self.labels)

    def matches(self, wanted: Mapping[str, str]) -> bool:
        have = self.label_map
        return all(have.get(k) == v for k, v in wanted.items())


@dataclass(frozen=True)
class Scrape:
    """A parsed exposition: the samples in order and the declared ``# TYPE`` of each family."""

    samples: tuple[Sample, ...]
    types: Mapping[str, str] = field(default_factory=dict)

    def __iter__(self) -> Iterator[Sample]:
        return iter(self.samples)

    def names(self) -> frozenset[str]:
        return frozenset(s.name for s in self.samples)

    def select(self, name: str, **labels: str) -> tuple[Sample, ...]:
        """Samples called ``name`` whose labels include every ``labels`` pair."""
        return tuple(s for s in self.samples if s.name == name and s.matches(labels))

    def total(self, name: str, **labels: str) -> float | None:
        """Sum of the matching samples (e.g. across engines), or None when there is none."""
        found = self.select(name, **labels)
        if not found:
            return None
        return math.fsum(s.value for s in found)


def parse(text: str) -> Scrape:
    """Parse a whole exposition into a :class:`Scrape`."""
    samples: list[Sample] = []
    types: dict[str, str] = {}
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            parts = line[1:].split(None, 3)
            if len(parts) >= 3 and parts[0] == "TYPE":
                types[parts[1]] = parts[2]
            continue
        samples.append(_parse_sample(line, lineno))
    return Scrape(samples=tuple(samples), types=types)


def _parse_sample(line: str, lineno: int) -> Sample:
    pos = 0
    if not line or line[0] not in _NAME_FIRST:
        raise PrometheusParseError(f"line {lineno}, column 1: expected a metric name in {line!r}")
    while pos < len(line) and line[pos] in _NAME_REST:
        pos += 1
    name = line[:pos]
    labels: list[tuple[str, str]] = []
    if pos < len(line) and line[pos] == "{":
        labels, pos = _parse_labels(line, pos + 1, lineno)
    rest = line[pos:].split()
    if not rest or len(rest) > 2:
        raise PrometheusParseError(
            f"line {lineno}, column {pos + 1}: expected 'value [timestamp]' after {name!r}, got {line[pos:]!r}"
        )
    value = _parse_value(rest[0], lineno)
    return Sample(name=name, labels=tuple(sorted(labels)), value=value)


def _parse_labels(line: str, pos: int, lineno: int) -> tuple[list[tuple[str, str]], int]:
    labels: list[tuple[str, str]] = []
    while True:
        pos = _skip_spaces(line, pos)
        if pos < len(line) and line[pos] == "}":
            return labels, pos + 1
        if pos >= len(line) or line[pos] not in _LABEL_FIRST:
            raise PrometheusParseError(f"line {lineno}, column {pos + 1}: expected a label name")
        start = pos
        while pos < len(line) and line[pos] in _LABEL_REST:
            pos += 1
        key = line[start:pos]
        pos = _skip_spaces(line, pos)
        if pos >= len(line) or line[pos] != "=":
            raise PrometheusParseError(f"line {lineno}, column {pos + 1}: expected '=' after label {key!r}")
        pos = _skip_spaces(line, pos + 1)
        if pos >= len(line) or line[pos] != '"':
            raise PrometheusParseError(f"line {lineno}, column {pos + 1}: expected '\"' to open label {key!r}")
        value, pos = _parse_quoted(line, pos + 1, lineno)
        labels.append((key, value))
        pos = _skip_spaces(line, pos)
        if pos < len(line) and line[pos] == ",":
            pos += 1
        elif pos < len(line) and line[pos] == "}":
            continue
        else:
            raise PrometheusParseError(f"line {lineno}, column {pos + 1}: expected ',' or '}}' after label {key!r}")


def _parse_quoted(line: str, pos: int, lineno: int) -> tuple[str, int]:
    out: list[str] = []
    while pos < len(line):
        ch = line[pos]
        if ch == '"':
            return "".join(out), pos + 1
        if ch == "\\":
            if pos + 1 >= len(line) or line[pos + 1] not in _ESCAPES:
                raise PrometheusParseError(f"line {lineno}, column {pos + 1}: bad escape in label value")
            out.append(_ESCAPES[line[pos + 1]])
            pos += 2
            continue
        out.append(ch)
        pos += 1
    raise PrometheusParseError(f"line {lineno}: unterminated label value")


def _parse_value(token: str, lineno: int) -> float:
    special = {"nan": math.nan, "+inf": math.inf, "inf": math.inf, "-inf": -math.inf}
    lowered = token.lower()
    if lowered in special:
        return special[lowered]
    try:
        return float(token)
    except ValueError:
        raise PrometheusParseError(f"line {lineno}: value {token!r} is not a number") from None


def _skip_spaces(line: str, pos: int) -> int:
    while pos < len(line) and line[pos] in " \t":
        pos += 1
    return pos
