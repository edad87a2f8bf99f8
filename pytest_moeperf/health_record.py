"""What the health gate hands the verdict core for one measurement window (the gate itself is `health`).

The gate's hook wrapper puts ``item.stash[health_key]`` before ``pytest_runtest_makereport`` runs for the call;
the session reads it there. A window with ``ok=False`` makes every metric of that test INCONCLUSIVE with the
reasons; ``facts`` go into the JSON report.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from pytest_moeperf.records import JSONScalar


@dataclass(frozen=True)
class HealthReport:
    ok: bool
    reasons: tuple[str, ...] = ()
    facts: dict[str, JSONScalar] = field(default_factory=dict)


health_key = pytest.StashKey[HealthReport]()
