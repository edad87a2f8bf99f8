"""Budget arithmetic on hand-made pieces (inputs to the pure functions, not measurements)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_moeperf.kernels.budget import (
    AllReducePoint,
    Piece,
    allreduce_latency,
    budget_lines,
    build_budget,
    main_budget,
    pieces_from_baselines,
    pieces_from_report,
    select_points,
)
from pytest_moeperf.kernels.devices import lookup
from pytest_moeperf.kernels.models import KIMI_K2_5, rank_gemms


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


def _allreduce_entry(latency: float) -> dict[str, object]:
    return {"test": "suites/allreduce/test_allreduce.py::test_allreduce[nccl-decode-b1-14KiB]",
            "name": "latency_graph", "unit": "us", "better": "lower",
            "summary": {"median": latency}, "context": {"op": "allreduce", "backend": "nccl", "bytes": 14336,
                                                         "world": 8, "mode": "graph"}}


def test_loaders_and_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    slug = "cpu-x86_64-2c"
    gemm_metrics = {
        f"suites/gemm/test_gemm.py::test_gemm[{p.op}]::time": {
            "test": f"suites/gemm/test_gemm.py::test_gemm[{p.op}]", "name": "time", "unit": "us", "better": "lower",
            "summary": {"median": p.time_us}, "context": {"model": p.model, "tp": 8, "op": p.op, "m": 1,
                                                          "impl": p.impl}}
        for p in uniform_pieces(2.0)
    }
    (tmp_path / slug).mkdir()
    (tmp_path / slug / "test_gemm.json").write_text(json.dumps({"metrics": gemm_metrics}))
    (tmp_path / slug / "test_allreduce.json").write_text(json.dumps({"metrics": {"k": _allreduce_entry(30.0)}}))
    pieces, points = pieces_from_baselines(tmp_path, slug)
    assert len(pieces) == 12 and [p.time_us for p in points] == [30.0]

    assert main_budget(["--baselines", str(tmp_path), "--fingerprint", slug]) == 0
    out = capsys.readouterr().out
    share = 100 * 123 * 30 / (547 * 2 + 123 * 30)
    assert f"all-reduce share {share:.1f} %" in out

    assert main_budget(["--baselines", str(tmp_path), "--fingerprint", slug, "--allreduce-us", "0.5"]) == 0
    assert "given (--allreduce-us)" in capsys.readouterr().out
    assert main_budget(["--baselines", str(tmp_path), "--fingerprint", "nope"]) == 2


def test_report_loader(tmp_path: Path) -> None:
    benchmarks = [{"fullname": "suites/gemm/test_gemm.py::test_gemm[x]::time", "params": {
        "model": "kimi-k2.5", "tp": 8, "op": "lm_head", "m": 1, "impl": "bf16"},
        "extra_info": {"metric": "time", "unit": "us"}, "stats": {"median": 7.5}}]
    path = tmp_path / "report.json"
    path.write_text(json.dumps({"benchmarks": benchmarks}))
    pieces, points = pieces_from_report(path)
    assert [(p.op, p.time_us) for p in pieces] == [("lm_head", 7.5)] and points == []


def test_lines_mention_what_is_not_modelled() -> None:
    text = "\n".join(budget_lines(build_budget(KIMI_K2_5, 8, 1, uniform_pieces(1.0), 10.0)))
    assert "attention core" in text and "Not modelled" in text


def test_report_section_needs_gemms_and_allreduces() -> None:
    from pytest_moeperf.kernels.budget import budget_sections_from
    from pytest_moeperf.records import Measurement

    gemms = [Measurement(f"suites/gemm/test_gemm.py::test_gemm[{p.op}]", "time", (1.0, 1.2, 0.8), "us", "lower",
                         context={"model": p.model, "tp": 8, "op": p.op, "m": 1, "impl": p.impl})
             for p in uniform_pieces(1.0)]
    ar = Measurement("suites/allreduce/test_allreduce.py::test_allreduce[nccl-decode-b1-14KiB]", "latency_graph",
                     (10.0,), "us", "lower", context={"op": "allreduce", "backend": "nccl", "bytes": 14336,
                                                      "world": 8})
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
