"""The ``attribution`` fixture: profile a decode window of a served model and record the per-step time of each
component as perf metrics, plus the attribution table in the reports.

Gated: the absolute per-step µs of each component (lower is better). Not gated: the shares, which move when
another component gets faster (an all-reduce share that grows because the GEMMs got faster is no
regression); they travel in each metric's context and in the report table.

    def test_decode_attribution(served, attribution, tmp_path):
        a = attribution.profile(served.server.base_url, trace_dir, batch=8)
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_moeperf.attribution.classify import COMPONENTS
from pytest_moeperf.attribution.table import COLUMNS
from pytest_moeperf.attribution.trace import Attribution, attribute_trace
from pytest_moeperf.ledger import JSONScalar, Measurement, Section
from pytest_moeperf.perf import Perf

__all__ = ["Attributor", "attribution", "metric_name"]

STEP, IDLE = "step", "idle"


def metric_name(component: str) -> str:
    """``routed-expert GEMM`` → ``attr_routed_expert_gemm_us``."""
    slug = "".join(ch if ch.isalnum() else "_" for ch in component.lower()).strip("_")
    return f"attr_{slug}_us"


class Attributor:
    """What the ``attribution`` fixture hands a test."""

    def __init__(self, perf: Perf) -> None:
        self._perf = perf

    def record(self, a: Attribution) -> Attribution:
        """Record ``a`` as metrics: one per component, idle/untraced and the step, in µs per step."""
        common: dict[str, JSONScalar] = {"attribution": True, "batch": a.batch, "steps": a.steps,
                                         "trace_device": a.device}
        parts = [(c, a.component_us.get(c, 0.0), a.share_pct(c)) for c in COMPONENTS]
        parts += [(IDLE, a.idle_us, a.idle_share_pct), (STEP, a.step_us, 100.0)]
        for component, us, share in parts:
            label = {IDLE: a.idle_label, STEP: "step (traced)"}.get(component, component)
            self._perf.record(metric_name(component), us, unit="us", better="lower",
                              context={**common, "component": label, "share_pct": round(share, 2)})
        return a

    def from_trace(self, path: Path, *, batch: int | None = None) -> Attribution:
        return self.record(attribute_trace(path, batch=batch))

    def profile(self, base_url: str, trace_dir: Path, *, batch: int, decode_tokens: int = 32,
                max_tokens: int = 512, timeout_s: float = 300.0, rank: int = 0) -> Attribution:
        """Profile one decode-only window (see :mod:`.window`), attribute worker ``rank``'s trace, record it."""
        from pytest_moeperf.attribution.window import profile_decode_window

        window = profile_decode_window(base_url, trace_dir, batch=batch, decode_tokens=decode_tokens,
                                       max_tokens=max_tokens, timeout_s=timeout_s)
        return self.from_trace(window.traces[rank], batch=batch)


@pytest.fixture
def attribution(perf: Perf) -> Attributor:
    return Attributor(perf)


def pytest_moeperf_report_sections(config: pytest.Config, measurements: list[Measurement]) -> list[Section]:
    """One attribution table per test and batch that recorded one."""
    groups: dict[tuple[str, int], list[Measurement]] = {}
    for m in measurements:
        if m.context.get("attribution") is True and isinstance(m.context.get("batch"), int):
            groups.setdefault((m.test_id, int(m.context["batch"])), []).append(m)  # type: ignore[arg-type]
    sections = []
    for (test_id, batch), ms in groups.items():
        rows = tuple((str(m.context.get("component")), f"{m.samples[0]:.4g}", f"{m.context.get('share_pct')}")
                     for m in ms)
        device = ms[0].context.get("trace_device")
        sections.append(Section(f"Decode-step attribution ({device} trace): batch={batch}", COLUMNS, rows,
                                f"{test_id}; shares are reported, the per-step us are gated"))
    return sections
