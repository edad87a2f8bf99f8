"""The GPU window plan and its time: the time model (`serving.load.timing`) of the windows the suites plan for the
TP=1 tiny profiles on 1x H200 (what ``moeperf batch serving`` runs there) reproduces the one start measured there
(324 s, cold), one start of it fits a 600 s call with a margin and three do not (a batch measures one start a call
there: the second is not begun); and the model itself on the figures it was built from."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from pytest_moeperf.serving.load.loadgen import ClosedLoop, OpenLoop
from pytest_moeperf.serving.load.timing import (
    H200_TP1,
    PROCESS_S,
    START_S,
    Planned,
    TokenTimes,
    batch_seconds,
    window_seconds,
)
from pytest_moeperf.serving.models.profiles import ServeProfile, load_profile_dirs
from pytest_moeperf.settings import GPU_STARTS

ROOT = Path(__file__).parents[2]
#: the batch's slot, and the share of it the plan may fill (the rest: a host slower than the slowest measured)
SLOT_S, FILL = 600.0, 0.85


def suite(path: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(Path(path).stem + "_plan", ROOT / path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def tp1_plan() -> list[Planned]:
    """One start's windows of every TP=1 tiny profile: the serving suite's on the no-spec profile, the spec-decode
    suite's on each candidate and its reference (the speed-ups reuse those windows)."""
    serving, specdecode = suite("suites/serving/test_serving.py"), suite("suites/specdecode/test_specdecode.py")
    profiles: dict[str, ServeProfile] = load_profile_dirs([ROOT / "suites/serving/profiles"])
    tp1 = [p for name, p in sorted(profiles.items()) if name.startswith("gpu-tiny-tp1-")]
    assert {p.method for p in tp1} == {"none", "ngram", "draft_model", "eagle3"}
    plan = []
    for profile in tp1:
        if not profile.speculates:
            plan += serving.planned_windows(profile)
        plan += specdecode.planned_windows(profile)
    return plan


#: the one whole start of the TP=1 plan measured on 1x H200 (vLLM 0.26, cold caches), seconds
MEASURED_START_S = 324.0


def test_the_model_reproduces_the_measured_start_and_one_start_fits_a_600_s_call() -> None:
    plan = tp1_plan()
    one = batch_seconds(plan, H200_TP1, 1)
    assert one == pytest.approx(MEASURED_START_S, rel=0.03), (
        f"one start of the TP=1 plan: {one:.0f} s predicted, {MEASURED_START_S:.0f} s measured: recalibrate "
        f"MEASURED_SCALE ({START_S:.0f} s a server start, {PROCESS_S:.0f} s a process)")
    assert one <= FILL * SLOT_S
    assert batch_seconds(plan, H200_TP1, GPU_STARTS) > SLOT_S, "three cold starts do not fit one 600 s call"


def test_the_plan_keeps_what_a_verdict_needs() -> None:
    for window in tp1_plan():
        edge = window.shape.concurrency if isinstance(window.shape, ClosedLoop) else 4
        assert window.output_len >= 128, f"{window.test}: TPOT per request averages >= 128 tokens"
        assert window.requests - 2 * edge >= 10 * (edge if isinstance(window.shape, ClosedLoop) else 1), \
            f"{window.test}: the drift check needs 10 blocks on the plateau"
        if window.test.startswith(("test_closed_loop", "test_open_loop", "test_chat")):
            assert window.requests - 2 * edge >= 29, f"{window.test}: a p90 needs 29 requests on the plateau"


def test_the_model_reads_the_measured_figures() -> None:
    times = TokenTimes(((1, 2.0), (16, 4.0)), ((1, 10.0), (16, 40.0)))
    assert times.at(times.tpot_ms, 8.5) == pytest.approx(3.0)  # linear between measured points
    assert times.at(times.tpot_ms, 64) == 4.0 and times.at(times.tpot_ms, 0.5) == 2.0  # the end values beyond
    # c=1, 31 requests of 128 tokens and 8 warm ones: 39 requests one after the other
    c1 = window_seconds(Planned("t", ClosedLoop(1), 31, 8, 128), times)
    assert c1 == pytest.approx(39 * (10.0 + 127 * 2.0) / 1000 + 1.0)
    # an open loop of 48 at 8/s, its warm pass of 12: 7.5 s of arrivals and the last request's latency
    r8 = window_seconds(Planned("t", OpenLoop(8.0), 48, 12, 128), times)
    assert r8 == pytest.approx(60 / 8 + times.request_s(max(1.0, 8 * times.request_s(1, 128)), 128) + 1.0)
    # the table's no-spec c=1 TPOT is the slower host's engine figure (2.40 ms; the faster one read 1.41-1.48)
    assert H200_TP1["none"].at(H200_TP1["none"].tpot_ms, 1) == 2.40
