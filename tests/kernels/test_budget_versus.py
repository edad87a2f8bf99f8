"""The budget beside a measured decode step (issue 29, item 3): the share the budget explains, what is left, and the
same table carried to the user's box.

Stored data, not made-up measurements: ``data/attribution-kimishape-tp1-h200.json`` is the `moeperf attribute`
table of `gpu-kimishape-tp1-nospec` on 1×H200 (docs/attribution.md, 2026-12-01, batch 1 and 8) in the format
`moeperf attribute --json` writes; the GEMM pieces are the committed `baselines/1x-h200`. (A real attribution on
the CPU needs HolisticTraceAnalysis, which the test environment does not have.) Served steps are written through
the report document's own writer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_moeperf.attribution.trace import Attribution
from pytest_moeperf.judging.thresholds import Threshold
from pytest_moeperf.judging.verdict import judge
from pytest_moeperf.kernels.budget import Piece, build_budget
from pytest_moeperf.kernels.budget.cli import main_budget
from pytest_moeperf.kernels.budget.measured import measured_steps
from pytest_moeperf.kernels.budget.versus import MeasuredStep, scaled, shape_mismatch, versus, versus_lines
from pytest_moeperf.kernels.models import KIMI_K2_5, rank_gemms, spec_from_config
from pytest_moeperf.ledger import Ledger, Measurement, Record, Round
from pytest_moeperf.reports.document import document

ROOT = Path(__file__).parents[2]
STORED = Path(__file__).parent / "data" / "attribution-kimishape-tp1-h200.json"
DENSE, ROUTED, AR, ATTN, OTHER = "dense GEMM", "routed-expert GEMM", "all-reduce", "attention", "other"


def _pieces(us: float) -> list[Piece]:
    return [Piece("kimi-k2.5", 8, s.op, 1, "int4" if s.component == "routed_experts" else "bf16", us,
                  device="NVIDIA H200") for s in rank_gemms(KIMI_K2_5, 8)]


def _traced(step: float, dense: float, routed: float, idle: float, ar: float = 0.0) -> MeasuredStep:
    comps = {DENSE: dense, ROUTED: routed, AR: ar, ATTN: 50.0, OTHER: 20.0}
    return MeasuredStep(step, 1, "trace", True, ar > 0, comps, idle)


def _report(path: Path, tpot_ms: float, *, profile: str = "gpu-kimi-rank-tp1-nospec", load: str = "c1",
            tp: int = 1, endpoint: str = "/v1/completions") -> Path:
    """A serving run's report with one engine_tpot_mean_ms, through the report writer."""
    m = Measurement(f"suites/serving/test_serving.py::test_closed_loop[{profile}-{load}]", "engine_tpot_mean_ms",
                    (tpot_ms,), "ms", "lower", context={"profile": profile, "load": load, "tp": tp,
                                                        "endpoint": endpoint})
    ledger = Ledger()
    ledger.add(Record(m, (Round(m.samples),)))
    ledger.decide(m.key, judge(m.key, m.name, m.unit, m.better, [m.samples], None, Threshold(0.05)))
    path.write_text(json.dumps(document(ledger, {}, {}, {"fingerprint": "1x-h200"})))
    return path


def test_the_rank_step_beside_the_budget_explains_a_share_and_names_what_is_left() -> None:
    budget = build_budget(KIMI_K2_5, 8, 1, _pieces(2.0), None, without_allreduce="only gloo measured")
    dense_modelled = 2.0 * sum(s.count for s in rank_gemms(KIMI_K2_5, 8) if s.component != "routed_experts")
    traced = _traced(3000.0, 1500.0, 400.0, 980.0)
    served = MeasuredStep(2500.0, 1, "engine TPOT", False, False)
    v = versus(budget, traced, served)
    parts = {p.name.split(" (")[0].split(":")[0]: p for p in v.parts}
    assert parts["dense GEMMs"].budget_us == dense_modelled and parts["dense GEMMs"].measured_us == 1500.0
    assert parts["routed-expert GEMMs"].budget_us == 2.0 * 120 and parts["routed-expert GEMMs"].measured_us == 400.0
    assert parts["all-reduce"].budget_us is None and "TP=1" in parts["all-reduce"].how
    assert parts["GPU idle"].measured_us == 980.0 and parts["GPU idle"].budget_us is None
    assert v.budget_us == 547 * 2.0
    assert v.explained_pct(served) == pytest.approx(100 * 1094 / 2500)
    text = "\n".join(versus_lines(v))
    assert f"The budget explains {100 * 1094 / 2500:.1f} % of the served step" in text
    assert "Profiler inflation: traced step / served step = 1.200" in text
    assert "attention core (KV-cache read) 50 us" in text and "GPU idle (launch gaps) 980 us" in text


def test_a_measured_step_with_all_reduces_meets_the_budgets_all_reduce() -> None:
    budget = build_budget(KIMI_K2_5, 8, 1, _pieces(2.0), 40.0, allreduce_source="given")
    v = versus(budget, _traced(9000.0, 1500.0, 400.0, 980.0, ar=5000.0), None)
    ar = next(p for p in v.parts if p.name == "all-reduce")
    assert (ar.budget_us, ar.measured_us) == (123 * 40.0, 5000.0)
    assert v.budget_us == 547 * 2.0 + 123 * 40.0
    with pytest.raises(ValueError, match="batch 8"):
        versus(budget, MeasuredStep(1.0, 8, "x", False, False), None)


def test_carried_to_the_users_box_gemms_scale_the_rest_stays_and_the_files_all_reduce_is_added() -> None:
    from pytest_moeperf.machine.topology import load_topology

    topo = load_topology("8x-rtx-pro-6000-pcie")
    (figure,) = topo.allreduce
    target = build_budget(KIMI_K2_5, 8, 1, _pieces(2.0), figure.us, allreduce_source="topology file")
    traced = _traced(3000.0, 1500.0, 400.0, 980.0)
    ratio = 4.8 / 1.792
    far = scaled(traced, ratio, "RTX PRO 6000", target)
    assert far.components[DENSE] == pytest.approx(1500.0 * ratio)
    assert far.components[ATTN] == 50.0 and far.idle_us == 980.0
    assert far.components[AR] == pytest.approx(123 * figure.us)
    assert far.step_us == pytest.approx(1900.0 * ratio + 70.0 + 980.0 + 123 * figure.us)
    served = scaled(MeasuredStep(2500.0, 1, "tpot", False, False), ratio, "RTX PRO 6000", target, traced)
    assert served.step_us == pytest.approx(2500.0 + (ratio - 1) * 1900.0 + 123 * figure.us)
    assert any("an estimate" in n for n in served.notes)
    v = versus(target, far, served)
    assert next(p for p in v.parts if p.name == "all-reduce").budget_us == pytest.approx(123 * figure.us)
    with pytest.raises(ValueError, match="without a trace"):
        scaled(MeasuredStep(2500.0, 1, "tpot", False, False), ratio, "RTX PRO 6000", target)


def test_the_shape_check_tells_a_rank_shaped_model_from_the_stand_in() -> None:
    from pytest_moeperf.serving.models.tinymodel import kimi_rank_shaped_spec

    assert shape_mismatch(KIMI_K2_5, 8, KIMI_K2_5, 8) is None
    stand_in = spec_from_config(kimi_rank_shaped_spec(tp=1).config(), "kimi-shaped-tp1")
    problem = shape_mismatch(KIMI_K2_5, 8, stand_in, 1)
    assert problem is not None and "does not run kimi-k2.5's TP=8 per-rank GEMMs" in problem


def test_measured_steps_are_read_from_attribution_json_and_serving_reports(tmp_path: Path) -> None:
    report = _report(tmp_path / "serving.json", 3.1)
    traced, served = measured_steps([STORED, report], 1)
    assert traced is not None and traced.step_us == 2962.0 and traced.components[ROUTED] == 315.4
    assert not traced.allreduce
    assert served is not None and served.step_us == pytest.approx(3100.0) and "c1 window" in served.source
    with pytest.raises(ValueError, match=r"no attribution at batch 32 \(batches: 1, 8\)"):
        measured_steps([STORED], 32)
    with pytest.raises(ValueError, match="no engine_tpot_mean_ms of a closed-loop completions window at c8"):
        measured_steps([report], 8)
    chat = _report(tmp_path / "chat.json", 2.0, endpoint="/v1/chat/completions")  # the chat window is c=1 too
    with pytest.raises(ValueError, match="no engine_tpot_mean_ms of a closed-loop completions window at c1"):
        measured_steps([chat], 1)
    at_8 = measured_steps([STORED, report], 8)  # the report has no c8 window: the trace's batch 8 alone
    assert at_8[0] is not None and at_8[0].step_us == 2705.0 and at_8[1] is None
    other = _report(tmp_path / "two.json", 1.4, profile="gpu-tiny-tp1-nospec")
    data = json.loads(other.read_text())
    data["benchmarks"] += json.loads(report.read_text())["benchmarks"]
    other.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="several profiles"):
        measured_steps([other], 1)
    assert measured_steps([other], 1, "gpu-tiny-tp1-nospec")[1].step_us == pytest.approx(1400.0)  # type: ignore[union-attr]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"batch": 1}]))
    with pytest.raises(ValueError, match=r"--measured .*bad.json: an attribution record has no 'component_us'"):
        measured_steps([bad], 1)
    assert Attribution.from_json(Attribution.from_json(json.loads(STORED.read_text())[0]).to_json()).step_us == 2962.0


def test_budget_cli_sets_the_stored_h200_rank_step_beside_the_committed_h200_baselines(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """End to end on stored data: the Kimi-shaped stand-in's traced b=1 step beside its budget from the committed
    1x-h200 GEMM baselines (its routed block is Kimi TP8's: the fused Marlin MoE piece moves to it)."""
    from pytest_moeperf.serving.models.tinymodel import kimi_rank_shaped_spec

    config = tmp_path / "kimi-shaped-tp1" / "config.json"
    config.parent.mkdir()
    config.write_text(json.dumps(kimi_rank_shaped_spec(tp=1).config()))
    report = _report(tmp_path / "serving.json", 3.1, profile="gpu-kimishape-tp1-nospec")
    argv = ["--model", str(config), "--tp", "1", "--baselines", str(ROOT / "baselines"), "--fingerprint", "1x-h200",
            "--measured", str(STORED), "--measured", str(report)]
    assert main_budget(argv) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "## Budget vs measured decode step: kimi-shaped-tp1, TP=1, batch=1" in out
    routed = next(line for line in out.splitlines() if line.startswith("| routed-expert GEMMs |"))
    assert "| 315.4 |" in routed  # the traced routed block beside 8 x the fused Marlin MoE piece
    dense = next(line for line in out.splitlines() if line.startswith("| dense GEMMs"))
    assert "budget incomplete: no time for qkv_proj, o_proj" in dense  # GQA: no measured pieces of that shape
    assert "The budget explains" in out and "of the served step" in out and "Profiler inflation" in out
    # the stand-in does not run Kimi's rank: the shape check refuses to call it the same model
    assert main_budget([*argv, "--measured-model", str(config), "--model", "kimi-k2.5", "--tp", "8"]) == 2
    assert "--measured-model: kimi-shaped-tp1 at TP=1 does not run" in capsys.readouterr().err


def test_budget_cli_carries_the_measured_step_to_the_target_box(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    rank = tmp_path / "rank.json"
    rank.write_text(json.dumps([Attribution("t", "gpu", 1, 30, 6000.0, {DENSE: 2500.0, ROUTED: 2100.0, AR: 0.0,
                                                                        ATTN: 300.0, OTHER: 400.0}, 700.0).to_json()]))
    argv = ["--model", "kimi-k2.5", "--tp", "8", "--baselines", str(ROOT / "baselines"), "--fingerprint", "1x-h200",
            "--measured", str(rank), "--topology", "8x-rtx-pro-6000-pcie"]
    assert main_budget(argv) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    ar = next(line for line in out.splitlines() if line.startswith("| all-reduce | 5753 | 5753 |"))
    assert "topology file 8x-rtx-pro-6000-pcie.json" in ar
    assert "GEMMs x2.68 to NVIDIA RTX PRO 6000 Blackwell Server Edition by datasheet bandwidth" in out
