"""Budget arithmetic on hand-made pieces (inputs to the pure functions, not measurements)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_moeperf.judging.thresholds import Reference, Threshold
from pytest_moeperf.judging.verdict import Status, judge
from pytest_moeperf.kernels.budget import (
    AllReducePoint,
    Piece,
    allreduce_latency,
    allreduce_points_from_store,
    budget_lines,
    build_budget,
    guard_metrics,
    inputs_from_baselines,
    inputs_from_measurements,
    inputs_from_report,
    select_points,
)
from pytest_moeperf.kernels.budget.cli import main_budget
from pytest_moeperf.kernels.devices import lookup
from pytest_moeperf.kernels.models import KIMI_K2_5, rank_gemms
from pytest_moeperf.ledger import Measurement
from pytest_moeperf.store.baselines import BaselineStore


def uniform_pieces(us: float, impl_routed: str = "int4") -> list[Piece]:
    return [Piece("kimi-k2.5", 8, s.op, 1, impl_routed if s.component == "routed_experts" else "bf16", us)
            for s in rank_gemms(KIMI_K2_5, 8)]


def test_sum_over_layers_and_share() -> None:
    # Every GEMM 1 us: per-layer op counts from the model; all-reduce 10 us x 123.
    budget = build_budget(KIMI_K2_5, 8, 1, uniform_pieces(1.0), 10.0)
    gemm_calls = sum(s.count for s in rank_gemms(KIMI_K2_5, 8))
    # 61 x 4 attention + 2 dense + 60 x (2 shared + router + 2 routed) + lm_head = 244 + 2 + 300 + 1
    assert gemm_calls == 547
    assert budget.total_us == pytest.approx(547 * 1.0 + 123 * 10.0)
    assert budget.allreduce_share_pct == pytest.approx(100 * 1230 / 1777)
    assert budget.missing == ()
    assert sum(r.share_pct or 0 for r in budget.rows) == pytest.approx(100.0)
    assert any(r.component == "not modelled" for r in budget.rows)


def test_routed_preference_and_missing() -> None:
    pieces = [p for p in uniform_pieces(1.0) if p.op != "lm_head"]
    pieces.append(Piece("kimi-k2.5", 8, "gate_up", 1, "bf16", 50.0))  # int4 piece is preferred over bf16
    budget = build_budget(KIMI_K2_5, 8, 1, pieces, None)
    gate_up = next(r for r in budget.rows if r.op == "gate_up")
    assert gate_up.each_us == 1.0 and "int4" in gate_up.source
    assert set(budget.missing) == {"lm_head", "all-reduce"}


def test_roofline_estimate_is_labelled() -> None:
    rtx = lookup("NVIDIA RTX PRO 6000 Blackwell Server Edition")
    budget = build_budget(KIMI_K2_5, 8, 1, [], 25.0, device=rtx)
    lm_head = next(r for r in budget.rows if r.op == "lm_head")
    assert lm_head.each_us == pytest.approx(7168 * 20480 * 2 / 1.792e12 * 1e6)
    assert "estimate" in lm_head.source
    gate_up = next(r for r in budget.rows if r.op == "gate_up")  # 8 experts touched at batch 1, int4 + scales
    assert gate_up.each_us == pytest.approx(8 * (7168 * 512 // 2 + 224 * 512 * 2) / 1.792e12 * 1e6)


def test_allreduce_interpolation() -> None:
    pts = [AllReducePoint(8192, 20.0, "nccl"), AllReducePoint(32768, 40.0, "nccl")]
    assert allreduce_latency(pts, 8192)[0] == 20.0
    t, src = allreduce_latency(pts, 16384)  # halfway in log-size: geometric mean
    assert t == pytest.approx((20.0 * 40.0) ** 0.5) and "interpolated" in src
    assert allreduce_latency(pts, 1 << 20)[0] == 40.0


def test_select_points_prefers_tp_nccl_graph() -> None:
    pts = [AllReducePoint(14336, 9.0, "gloo", 2, mode="eager"), AllReducePoint(14336, 30.0, "nccl", 8, mode="eager"),
           AllReducePoint(14336, 20.0, "nccl", 8, mode="graph"), AllReducePoint(14336, 5.0, "nccl", 2, mode="graph")]
    assert [p.time_us for p in select_points(pts, 8)] == [20.0]
    fallback = select_points(pts[:1], 8)
    assert fallback[0].time_us == 9.0 and "2 ranks measured, TP=8" in fallback[0].source


def _ar_measurement(latency: float, **context: object) -> Measurement:
    ctx = {"op": "allreduce", "backend": "nccl", "bytes": 14336, "world": 8, "mode": "graph", **context}
    return Measurement("suites/allreduce/test_allreduce.py::test_allreduce[nccl-decode-b1-14KiB]",
                       "latency_graph", (latency,), "us", "lower", context=ctx)  # type: ignore[arg-type]


def _gemm_measurements(pieces: list[Piece]) -> list[Measurement]:
    return [Measurement(f"suites/gemm/test_gemm.py::test_gemm[{p.op}-{p.impl}]", "time", (p.time_us,), "us",
                        "lower", context={"model": p.model, "tp": p.tp, "op": p.op, "m": p.m, "impl": p.impl})
            for p in pieces]


def test_loaders_and_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    slug = "cpu-x86_64-2c"
    store = BaselineStore(tmp_path, slug)  # written by the store itself: the format has one writer, one reader
    store.update([*_gemm_measurements(uniform_pieces(2.0)), _ar_measurement(30.0)], {"slug": slug}, {})
    pieces, points = inputs_from_baselines(tmp_path, slug)
    assert len(pieces) == 12 and [p.time_us for p in points] == [30.0]
    assert [p.time_us for p in allreduce_points_from_store(BaselineStore(tmp_path, slug))] == [30.0]

    assert main_budget(["--baselines", str(tmp_path), "--fingerprint", slug]) == 0
    out = capsys.readouterr().out
    share = 100 * 123 * 30 / (547 * 2 + 123 * 30)
    assert f"all-reduce share {share:.1f} %" in out

    assert main_budget(["--baselines", str(tmp_path), "--fingerprint", slug, "--allreduce-us", "0.5"]) == 0
    assert "given (--allreduce-us)" in capsys.readouterr().out
    assert main_budget(["--baselines", str(tmp_path), "--fingerprint", "nope"]) == 2


def test_baselines_are_read_through_the_store_schema_check(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    # A file without the schema the store reads was silently accepted by the budget's own reader before.
    (tmp_path / "s").mkdir()
    entry = {"test": "t", "name": "latency_graph", "unit": "us", "better": "lower", "summary": {"median": 30.0},
             "context": {"op": "allreduce", "backend": "nccl", "bytes": 14336, "world": 8, "mode": "graph"}}
    (tmp_path / "s" / "test_allreduce.json").write_text(json.dumps({"metrics": {"k": entry}}))
    assert main_budget(["--baselines", str(tmp_path), "--fingerprint", "s"]) == 2
    assert "schema" in capsys.readouterr().err


def test_inputs_are_declared_context_keys_not_synonyms() -> None:
    # Before: "message_bytes", "ranks" and a test id containing "allreduce" were guessed into all-reduce points.
    guessed = Measurement("suites/x/test_allreduce_like.py::test_x", "latency", (5.0,), "us", "lower",
                          context={"message_bytes": 14336, "ranks": 8})
    assert inputs_from_measurements([guessed]) == ([], [])
    no_mode = _ar_measurement(5.0, mode=None)
    assert inputs_from_measurements([no_mode]) == ([], [])
    eager_named_graph = _ar_measurement(5.0, mode="eager")  # metric latency_graph with mode eager: inconsistent
    assert inputs_from_measurements([eager_named_graph])[1] == []
    assert [p.mode for p in inputs_from_measurements([_ar_measurement(5.0)])[1]] == ["graph"]
    gemm_without_impl = Measurement("suites/gemm/test_gemm.py::t", "time", (1.0,), "us", "lower",
                                    context={"model": "kimi-k2.5", "tp": 8, "op": "o_proj", "m": 1})
    assert inputs_from_measurements([gemm_without_impl]) == ([], [])


def test_fused_moe_piece_replaces_gate_up_and_down() -> None:
    pieces = uniform_pieces(1.0) + [Piece("kimi-k2.5", 8, "routed_moe", 1, "marlin_moe", 5.0)]
    budget = build_budget(KIMI_K2_5, 8, 1, pieces, 10.0)
    routed = [r for r in budget.rows if r.component == "routed_experts"]
    assert len(routed) == 1 and routed[0].op.startswith("routed_moe") and routed[0].each_us == 5.0
    assert routed[0].count == KIMI_K2_5.moe_layers and "marlin_moe" in routed[0].source
    per_op = build_budget(KIMI_K2_5, 8, 1, pieces, 10.0, routed_impl="int4")
    assert [r.op for r in per_op.rows if r.component == "routed_experts"] == ["gate_up", "down"]


def _verdicts(baseline: list[Piece], current: list[Piece], ar_us: float) -> dict[str, tuple[Status, bool]]:
    old = {g.name: g for g in guard_metrics(build_budget(KIMI_K2_5, 8, 1, baseline, ar_us))}
    out = {}
    for g in guard_metrics(build_budget(KIMI_K2_5, 8, 1, current, ar_us)):
        # 4 rounds against 3 stored runs: enough for the rank test to decide
        v = judge(g.name, g.name, g.unit, g.better, [[g.value] * 5] * 4, Reference((old[g.name].value,) * 3),
                  Threshold(0.05))
        out[g.name] = (v.status, g.gated)
    return out


def test_guard_reads_a_gemm_speedup_as_an_improvement_not_a_regression() -> None:
    # Defect 2: the guard gated allreduce_share_pct lower-is-better; with only the GEMM term moving, a GEMM
    # speed-up (e.g. Marlin becoming available) raised the share and failed the test.
    faster = _verdicts(uniform_pieces(2.0), uniform_pieces(1.0), 10.0)
    assert faster["gemm_step_us"] == (Status.IMPROVED, True)
    assert faster["allreduce_step_us"] == (Status.PASS, False)  # read from the all-reduce baselines: not gated
    assert faster["allreduce_share_pct"] == (Status.REGRESSED, False)  # what the old gate said: now not gated
    assert not any(status is Status.REGRESSED for status, gated in faster.values() if gated)
    slower = _verdicts(uniform_pieces(1.0), uniform_pieces(2.0), 10.0)
    assert slower["gemm_step_us"] == (Status.REGRESSED, True)  # a GEMM slowdown is a regression, not IMPROVED


def test_report_loader(tmp_path: Path) -> None:
    benchmarks = [{"fullname": "suites/gemm/test_gemm.py::test_gemm[x]::time", "params": {
        "model": "kimi-k2.5", "tp": 8, "op": "lm_head", "m": 1, "impl": "bf16"},
        "extra_info": {"metric": "time", "unit": "us"}, "stats": {"median": 7.5}}]
    path = tmp_path / "report.json"
    path.write_text(json.dumps({"benchmarks": benchmarks}))
    pieces, points = inputs_from_report(path)
    assert [(p.op, p.time_us) for p in pieces] == [("lm_head", 7.5)] and points == []


def test_lines_mention_what_is_not_modelled() -> None:
    text = "\n".join(budget_lines(build_budget(KIMI_K2_5, 8, 1, uniform_pieces(1.0), 10.0)))
    assert "attention core" in text and "Not modelled" in text


def test_report_section_needs_gemms_and_allreduces() -> None:
    from pytest_moeperf.kernels.budget import budget_sections_from

    gemms = [Measurement(f"suites/gemm/test_gemm.py::test_gemm[{p.op}]", "time", (1.0, 1.2, 0.8), "us", "lower",
                         context={"model": p.model, "tp": 8, "op": p.op, "m": 1, "impl": p.impl})
             for p in uniform_pieces(1.0)]
    ar = _ar_measurement(10.0)
    assert budget_sections_from(gemms) == []  # type: ignore[arg-type]
    sections = budget_sections_from([*gemms, ar])  # type: ignore[arg-type]
    assert len(sections) == 1 and "TP=8 batch=1" in sections[0].title
    ar_row = next(r for r in sections[0].rows if r[0] == "all-reduce")
    assert ar_row[5] == f"{100 * 1230 / 1777:.1f}"


def test_pieces_from_another_gpu_are_scaled_by_bandwidth() -> None:
    rtx = lookup("NVIDIA RTX PRO 6000 Blackwell Server Edition")
    pieces = [Piece(p.model, p.tp, p.op, p.m, p.impl, 10.0, device="NVIDIA H200") for p in uniform_pieces(1.0)]
    budget = build_budget(KIMI_K2_5, 8, 1, pieces, 25.0, device=rtx)
    row = next(r for r in budget.rows if r.op == "o_proj")
    assert row.each_us == pytest.approx(10.0 * 4.8 / 1.792) and "scaled" in row.source
    same = build_budget(KIMI_K2_5, 8, 1, pieces, 25.0, device=lookup("NVIDIA H200"))
    assert next(r for r in same.rows if r.op == "o_proj").each_us == 10.0
    cpu = [Piece(p.model, p.tp, p.op, p.m, p.impl, 10.0, device="x86_64") for p in uniform_pieces(1.0)]
    unscaled = build_budget(KIMI_K2_5, 8, 1, cpu, 25.0, device=rtx)  # no datasheet figure for a CPU: as measured
    assert next(r for r in unscaled.rows if r.op == "o_proj").each_us == 10.0


def test_routed_impl_override_and_floor() -> None:
    rtx = lookup("NVIDIA RTX PRO 6000 Blackwell Server Edition")
    pieces = uniform_pieces(1.0) + [Piece("kimi-k2.5", 8, "gate_up", 1, "grouped", 3.0)]
    grouped = build_budget(KIMI_K2_5, 8, 1, pieces, 10.0, routed_impl="grouped")
    assert next(r for r in grouped.rows if r.op == "gate_up").each_us == 3.0
    assert "down" in grouped.missing  # no grouped piece for down, and no device for an estimate
    floor = build_budget(KIMI_K2_5, 8, 1, pieces, 10.0, device=rtx, routed_impl="floor")
    gate_up = next(r for r in floor.rows if r.op == "gate_up")
    assert "estimate" in gate_up.source
    assert gate_up.each_us == pytest.approx(8 * (7168 * 512 // 2 + 224 * 512 * 2) / 1.792e12 * 1e6)
    assert next(r for r in floor.rows if r.op == "q_b_proj").each_us == 1.0  # dense ops stay measured
    with pytest.raises(ValueError, match="routed_impl must be one of"):
        build_budget(KIMI_K2_5, 8, 1, pieces, 10.0, routed_impl="cutlass")


def test_a_model_with_kimis_per_rank_shapes_reuses_kimis_measurements_and_says_so() -> None:
    from pytest_moeperf.kernels.models import spec_from_config
    from pytest_moeperf.serving.models.tinymodel import kimi_rank_shaped_spec

    shaped = spec_from_config(kimi_rank_shaped_spec(tp=2).config(), "kimi-shaped")
    kimi = {s.op: s for s in rank_gemms(KIMI_K2_5, 8)}
    pieces = [Piece("kimi-k2.5", 8, op, 1, "bf16", t, "baselines x", "", kimi[op].k, kimi[op].n)
              for op, t in (("gate_up", 40.0), ("down", 20.0), ("router", 5.0), ("fused_qkv_a", 9.0))]
    budget = build_budget(shaped, 2, 1, pieces, 7.0)
    rows = {r.op: r for r in budget.rows}
    assert rows["gate_up"].each_us == 40.0 and rows["down"].each_us == 20.0 and rows["router"].each_us == 5.0
    assert "same per-rank shape as kimi-k2.5 TP8 gate_up (7168x512)" in rows["gate_up"].source
    assert "fused_qkv_a" not in rows  # an MLA op the GQA model does not have
    assert rows["qkv_proj"].each_us is None  # GQA projections: other shapes, not measured
    # routed pieces of a model with another expert count do not cover the same experts: not reused
    other = build_budget(spec_from_config({**kimi_rank_shaped_spec(tp=2).config(), "num_experts": 128}, "o"), 2, 1,
                         pieces, 7.0)
    assert {r.op: r for r in other.rows}["gate_up"].each_us is None


def test_a_fused_moe_piece_moves_to_a_model_with_the_same_routed_block() -> None:
    """The fused piece covers the whole routed block: it moves only when hidden size, expert intermediate per rank,
    expert count and top-k all match (Kimi TP8's block is `kimi-shaped-tp1`'s and `-tp2`'s)."""
    from pytest_moeperf.kernels.models import spec_from_config
    from pytest_moeperf.serving.models.tinymodel import kimi_rank_shaped_spec

    fused = Piece("kimi-k2.5", 8, "routed_moe", 1, "marlin_moe", 34.3, "baselines x", "", 7168, 256)
    for tp in (1, 2):
        shaped = spec_from_config(kimi_rank_shaped_spec(tp=tp).config(), f"kimi-shaped-tp{tp}")
        routed = [r for r in build_budget(shaped, tp, 1, [fused], 7.0).rows if r.component == "routed_experts"]
        assert [(r.each_us, r.count) for r in routed] == [(34.3, 8)], tp
        assert "same per-rank shape as kimi-k2.5 TP8 routed_moe (7168x256)" in routed[0].source
    wider = spec_from_config({**kimi_rank_shaped_spec(tp=1).config(), "moe_intermediate_size": 512}, "wider")
    routed = [r for r in build_budget(wider, 1, 1, [fused], 7.0).rows if r.component == "routed_experts"]
    assert all(r.op != "routed_moe (gate_up + act + down)" for r in routed)
