"""Where the budget's all-reduce term comes from (issue 29, item 4): never a TP=8 step built from gloo on CPU
processes or from fewer ranks; a given figure, a topology file's figure, or GPU baselines of the same slug family
measured on TP ranks; otherwise the step without all-reduce, saying why. Baselines are written by the store
itself; the inputs are hand-made (they are inputs to the rule, not measurements)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_moeperf.kernels.budget import (
    AllReducePoint,
    Candidate,
    Piece,
    budget_sections_from,
    build_budget,
    choose_allreduce,
)
from pytest_moeperf.kernels.budget.cli import main_budget
from pytest_moeperf.kernels.budget.sources import point_problem, slug_family
from pytest_moeperf.kernels.models import KIMI_K2_5, rank_gemms
from pytest_moeperf.ledger import Measurement
from pytest_moeperf.machine.topology import TopologyError, load_topology
from pytest_moeperf.store.baselines import BaselineStore

GLOO_2 = AllReducePoint(14336, 222.7, "gloo", 2, "", "eager")
NCCL_2 = AllReducePoint(14336, 7.3, "nccl", 2, "", "graph")
NCCL_8 = AllReducePoint(14336, 30.0, "nccl", 8, "", "graph")


def _gemms(us: float, device: str = "NVIDIA H200") -> list[Measurement]:
    return [Measurement(f"suites/gemm/test_gemm.py::test_gemm[{s.op}]", "time", (us,), "us", "lower",
                        context={"model": "kimi-k2.5", "tp": 8, "op": s.op, "m": 1,
                                 "impl": "int4" if s.component == "routed_experts" else "bf16", "device": device})
            for s in rank_gemms(KIMI_K2_5, 8)]


def _allreduce(point: AllReducePoint) -> Measurement:
    ctx = {"op": "allreduce", "backend": point.backend, "bytes": point.bytes, "world": point.world_size,
           "mode": point.mode}
    return Measurement(f"suites/allreduce/test_allreduce.py::test_allreduce[{point.backend}-{point.world_size}]",
                       f"latency_{point.mode}", (point.time_us,), "us", "lower", context=ctx)  # type: ignore[arg-type]


def _store(root: Path, slug: str, measurements: list[Measurement]) -> None:
    BaselineStore(root, slug).update(measurements, {"slug": slug}, {})


def _budget(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert main_budget(list(argv)) == 0, capsys.readouterr().err
    return capsys.readouterr().out


def test_slug_family_drops_the_gpu_count_only() -> None:
    assert slug_family("8x-h200-nvlink") == slug_family("2x-h200-nvlink") == "h200-nvlink"
    assert slug_family("1x-h200") == "h200" != slug_family("2x-h200-nvlink")
    assert slug_family("2x-h200-nvlink+pcie-no-p2p") != slug_family("2x-h200-nvlink")
    assert slug_family("cpu-x86-64-2c") == "cpu-x86-64-2c"


def test_what_cannot_stand_for_a_tp8_all_reduce() -> None:
    assert "CPU processes" in (point_problem(AllReducePoint(14336, 222.7, "gloo", 8), 8) or "")
    assert point_problem(NCCL_2, 8) == "2 ranks measured, TP=8 needs 8"
    assert "not recorded" in (point_problem(AllReducePoint(14336, 9.0, "nccl", 0), 8) or "")
    assert point_problem(NCCL_8, 8) is None


def test_sources_in_order_given_then_file_then_measured_then_family() -> None:
    measured = Candidate("baselines 2x-h200-nvlink", (GLOO_2, NCCL_2))
    family = Candidate("baselines 8x-h200-nvlink", (NCCL_8,))
    given = choose_allreduce(8, [Candidate("given (--allreduce-us)", fixed_us=40.0), measured, family])
    assert (given.fixed_us, given.source) == (40.0, "given (--allreduce-us)")
    chosen = choose_allreduce(8, [measured, family])
    assert [p.time_us for p in chosen.points] == [30.0] and chosen.source == "baselines 8x-h200-nvlink"
    assert len(chosen.set_aside) == 2  # gloo and the 2-rank NCCL of the measured box, each with its reason
    none = choose_allreduce(8, [measured])
    assert not none.found and "gloo" in none.without and "2 ranks measured, TP=8 needs 8" in none.without
    assert choose_allreduce(1, [measured]).source == "TP=1: no all-reduce"
    refused = choose_allreduce(8, [Candidate("report r.json", (NCCL_8,), refused="measured on 2x-h200-nvlink")])
    assert not refused.found and "measured on 2x-h200-nvlink" in refused.without


def test_a_1xh200_box_shows_the_tp8_step_without_its_gloo_all_reduce(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """The issue's case: GPU GEMMs and the gloo stand-in (2 CPU processes, 222.7 us) made a '35.3 ms TP=8 step' with
    all-reduce 77.6 % of it. Now: the step without all-reduce, and why."""
    _store(tmp_path, "1x-h200", [*_gemms(2.0), _allreduce(GLOO_2)])
    out = _budget(capsys, "--baselines", str(tmp_path), "--fingerprint", "1x-h200")
    assert "all-reduce share" not in out
    assert f"Modelled step time without all-reduce: {547 * 2.0:.4g} us per rank" in out
    assert "123 all-reduces of 14336 B a step not included" in out
    assert "baselines 1x-h200: gloo eager on 2 ranks (gloo runs between CPU processes, not GPUs)" in out


def test_fewer_ranks_are_not_a_tp8_step_but_same_family_baselines_on_8_ranks_are(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _store(tmp_path, "2x-h200-nvlink", [*_gemms(2.0), _allreduce(NCCL_2)])
    out = _budget(capsys, "--baselines", str(tmp_path), "--fingerprint", "2x-h200-nvlink")
    assert "without all-reduce" in out and "nccl graph on 2 ranks (2 ranks measured, TP=8 needs 8)" in out
    _store(tmp_path, "8x-h200-nvlink", [_allreduce(NCCL_8)])
    _store(tmp_path, "8x-h200-nvlink+pcie-no-p2p", [_allreduce(AllReducePoint(14336, 99.0, "nccl", 8, "", "graph"))])
    out = _budget(capsys, "--baselines", str(tmp_path), "--fingerprint", "2x-h200-nvlink")
    share = 100 * 123 * 30.0 / (547 * 2.0 + 123 * 30.0)
    assert f"all-reduce share {share:.1f} %" in out  # 8x-h200-nvlink's 30 us; the emulated family's 99 us not
    assert "baselines 8x-h200-nvlink (slug family h200-nvlink)" in out
    assert "All-reduce figures set aside: baselines 2x-h200-nvlink: nccl graph on 2 ranks" in out


def test_the_target_topology_file_carries_its_own_figure(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _store(tmp_path, "1x-h200", [*_gemms(2.0), _allreduce(GLOO_2)])
    out = _budget(capsys, "--baselines", str(tmp_path), "--fingerprint", "1x-h200", "--topology",
                  "8x-rtx-pro-6000-pcie")
    ar = next(line for line in out.splitlines() if line.startswith("| all-reduce | 14336 B"))
    assert "| 123 | 46.77 |" in ar and "topology file 8x-rtx-pro-6000-pcie.json" in ar
    assert "0.515 x 11170 / 123" in ar and "stated nccl 8 ranks" in ar  # where it came from, and not 'measured'
    given = _budget(capsys, "--baselines", str(tmp_path), "--fingerprint", "1x-h200", "--topology",
                    "8x-rtx-pro-6000-pcie", "--allreduce-us", "12.5")
    assert "| 123 | 12.5 |" in given and "given (--allreduce-us)" in given


def test_a_report_measured_on_another_family_does_not_give_the_target_its_all_reduce(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    topo = tmp_path / "box.json"
    data = json.loads(Path(load_topology("8x-rtx-pro-6000-pcie").source).read_text())
    topo.write_text(json.dumps({k: v for k, v in data.items() if k != "allreduce"}))  # a box stating no figure
    benchmarks = [{"fullname": f"{m.test_id}::{m.name}", "params": dict(m.context),
                   "extra_info": {"metric": m.name, "unit": m.unit}, "stats": {"median": m.samples[0]}}
                  for m in [*_gemms(2.0), _allreduce(NCCL_8)]]
    report = tmp_path / "report.json"
    report.write_text(json.dumps({"benchmarks": benchmarks, "moeperf": {"fingerprint": "8x-h200-nvlink"}}))
    own = _budget(capsys, "--from-report", str(report))
    assert "all-reduce share" in own and "report report.json" in own
    out = _budget(capsys, "--from-report", str(report), "--topology", str(topo))
    assert "without all-reduce" in out
    assert "report report.json: measured on 8x-h200-nvlink, the target is 8x-rtx-pro-6000-pcie" in out


def test_the_session_budget_section_leaves_gloo_out_too() -> None:
    sections = budget_sections_from([*_gemms(1.0, device="x86_64"), _allreduce(GLOO_2)])
    assert len(sections) == 1
    assert "without all-reduce" in sections[0].note and "gloo runs between CPU processes" in sections[0].note
    ar = next(r for r in sections[0].rows if r[0] == "all-reduce")
    assert ar[3] == "-" and ar[6].startswith("left out:")


def test_a_budget_left_without_all_reduce_is_not_incomplete() -> None:
    pieces = [Piece("kimi-k2.5", 8, s.op, 1, "bf16", 1.0) for s in rank_gemms(KIMI_K2_5, 8)]
    left = build_budget(KIMI_K2_5, 8, 1, pieces, None, without_allreduce="only gloo measured")
    assert left.missing == () and left.without_allreduce == "only gloo measured" and left.total_us == 547.0
    assert build_budget(KIMI_K2_5, 8, 1, pieces, None).missing == ("all-reduce",)


@pytest.mark.parametrize(("entry", "message"), [
    ({"bytes": 14336, "us": 46.77, "world": 1, "backend": "nccl", "source": "x"}, "world >= 2"),
    ({"bytes": 14336, "us": 46.77, "world": 8, "backend": "nccl"}, "missing field 'source'"),
    ({"bytes": 14336, "us": 46.77, "world": 8, "backend": "nccl", "source": " "}, "must say where"),
    ({"bytes": 14336, "us": "fast", "world": 8, "backend": "nccl", "source": "x"}, "field 'us' must be"),
    ({"bytes": 14336, "us": 46.77, "world": 8, "backend": "nccl", "source": "x", "ranks": 8}, "unknown field"),
])
def test_a_topology_files_all_reduce_entry_is_checked(tmp_path: Path, entry: dict[str, object], message: str) -> None:
    data = json.loads(Path(load_topology("8x-rtx-pro-6000-pcie").source).read_text())
    path = tmp_path / "t.json"
    path.write_text(json.dumps({**data, "allreduce": [entry]}))
    with pytest.raises(TopologyError, match=message) as err:
        load_topology(path)
    assert "allreduce[0]" in str(err.value)


def test_the_bundled_target_states_the_investigations_figure_and_a_probe_states_none() -> None:
    topo = load_topology("8x-rtx-pro-6000-pcie")
    (figure,) = topo.allreduce
    assert (figure.bytes, figure.world, figure.backend) == (14336, 8, "nccl")
    assert figure.us == pytest.approx(0.515 * 11170 / 123, abs=0.01)
    assert topo.to_json()["allreduce"][0]["us"] == figure.us
    assert "allreduce" not in load_topology("2x-h200-nvlink").to_json()
