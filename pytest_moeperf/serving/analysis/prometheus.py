"""A scrape of vLLM's ``/metrics``: parsed by ``prometheus_client``'s text parser, plus the two questions we ask
of it: the total of a counter (summed over engines and label sets) and a histogram's mean over a window.

``prometheus_client`` is an optional dependency (the ``serving`` extra): imported when a scrape is parsed.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

__all__ = ["PrometheusParseError", "Sample", "Scrape", "histogram_mean_delta", "parse"]


class PrometheusParseError(ValueError):
    """The exposition could not be parsed; the message carries the parser's complaint."""


@dataclass(frozen=True)
class Sample:
    """One sample line: metric name (as exposed, e.g. with ``_total``), its labels (sorted pairs) and value."""

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
    """A parsed exposition: the samples in order and the declared type of each family."""

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
    """Parse a whole exposition (Prometheus text format) into a :class:`Scrape`."""
    from prometheus_client.parser import text_string_to_metric_families  # optional: the [serving] extra

    samples: list[Sample] = []
    types: dict[str, str] = {}
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                types.setdefault(s.name, family.type)
                samples.append(Sample(s.name, tuple(sorted(s.labels.items())), float(s.value)))
    except ValueError as exc:
        raise PrometheusParseError(f"unparsable Prometheus exposition: {exc}") from exc
    return Scrape(samples=tuple(samples), types=types)


def histogram_mean_delta(before: Scrape, after: Scrape, name: str) -> float | None:
    """Mean of the observations a histogram received between two scrapes (None if none arrived)."""
    sum0, sum1 = before.total(name + "_sum"), after.total(name + "_sum")
    n0, n1 = before.total(name + "_count"), after.total(name + "_count")
    if sum0 is None or sum1 is None or n0 is None or n1 is None or n1 <= n0:
        return None
    return (sum1 - sum0) / (n1 - n0)
