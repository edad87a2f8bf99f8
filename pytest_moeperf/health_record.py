"""What the health gate found about one test's measurement window (read by the verdict side)."""
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
