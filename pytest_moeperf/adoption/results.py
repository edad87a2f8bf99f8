"""pytest-benchmark's result of one test as the test's metric (pure: no pytest, no pytest-benchmark import).

The input is the entry pytest-benchmark writes for a test in its JSON (its ``Metadata.as_dict``: ``group``,
``params``, ``extra_info``, ``stats`` with ``data``, ``rounds``, ``iterations``); the output is what ``perf.record``
takes for the metric `METRIC`:

- **samples**: pytest-benchmark's rounds, each the time of one call (a round's time over its iterations), in the
  unit asked for. Past `MAX_SAMPLES` rounds (a fast function runs hundreds of thousands) they are kept as that many
  evenly spaced quantiles, so that the median, quartiles, minimum and maximum (what the judge and the baselines
  read) are the rounds' exactly while a ledger stays small; the context keeps the real count.
- **context**: the test's params (the node id in the key holds them too, as for any parametrized test), the
  ``group`` when there is one, ``benchmark_rounds`` and ``benchmark_iterations`` (the calibration), then
  ``benchmark.extra_info``, which wins a name it shares. A value that is no str, number, bool or None is kept as its
  JSON text (a list, a dict) or else its ``repr`` (a class). ``round_unit`` is the plugin's own (`ledger.ROUND_UNIT`)
  and is not taken; ``workload`` and ``state`` mean what they mean for any metric.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pytest_moeperf.judging import stats
from pytest_moeperf.ledger import ROUND_UNIT, JSONScalar
from pytest_moeperf.reports.document import TIME_UNITS

#: the metric an adopted benchmark records
METRIC = "time"
#: the units it may be recorded in (the first: the default, ``on``), and the setting that adopts nothing
UNITS = ("s", "ms", "us", "ns")
OFF = "off"
#: the most samples one round of an adopted benchmark keeps (1000 intervals: the quartiles fall on points)
MAX_SAMPLES = 1001


@dataclass(frozen=True)
class Adopted:
    """What ``perf.record`` gets for an adopted benchmark."""

    samples: tuple[float, ...]
    unit: str
    context: dict[str, JSONScalar] = field(default_factory=dict)


def scalar(value: Any) -> JSONScalar:
    """``value`` as a context value: itself when a str, number, bool or None; else its JSON text, else its repr."""
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    try:
        return json.dumps(value, sort_keys=True)
    except (TypeError, ValueError):
        return repr(value)


def adopt(entry: Mapping[str, Any], unit: str) -> Adopted:
    """The metric of one pytest-benchmark result (module docstring); `ValueError` names the test when it has no
    rounds or the unit is not one of `UNITS`."""
    name = entry.get("fullname") or entry.get("name") or "a test"
    if unit not in UNITS:
        raise ValueError(f"pytest-benchmark result of {name}: unit {unit!r} is not one of {', '.join(UNITS)}")
    measured = entry["stats"]
    seconds = [float(x) for x in measured["data"]]
    if not seconds:
        raise ValueError(f"pytest-benchmark result of {name}: no rounds")
    kept = seconds if len(seconds) <= MAX_SAMPLES else stats.quantile_points(seconds, MAX_SAMPLES)
    per_unit = TIME_UNITS[unit]
    context: dict[str, JSONScalar] = {str(k): scalar(v) for k, v in (entry.get("params") or {}).items()}
    if entry.get("group") is not None:
        context["group"] = scalar(entry["group"])
    context["benchmark_rounds"] = int(measured.get("rounds", len(seconds)))
    context["benchmark_iterations"] = int(measured.get("iterations", 1))
    context.update({str(k): scalar(v) for k, v in (entry.get("extra_info") or {}).items()})
    context.pop(ROUND_UNIT, None)
    return Adopted(tuple(x / per_unit for x in kept), unit, context)
