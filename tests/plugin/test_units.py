"""Pure pieces: statistics, thresholds, verdicts, fingerprints, the baseline store and diff."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from pytest_moeperf import baselines, stats, topology
from pytest_moeperf.records import Measurement
from pytest_moeperf.thresholds import Threshold
from pytest_moeperf.verdict import Status, judge, worst


def test_quantiles_match_linear_interpolation() -> None:
    values = [4.0, 1.0, 3.0, 2.0]
    assert stats.median(values) == 2.5
    assert stats.quantile(values, 0.25) == pytest.approx(1.75)
    assert stats.iqr(values) == pytest.approx(1.5)
    with pytest.raises(ValueError):
        stats.quantile([], 0.5)


def test_median_ci_brackets_the_median_and_is_deterministic() -> None:
    values = [10.0 + 0.1 * (i % 7) for i in range(40)]
    low, high = stats.median_ci(values)
    assert low <= stats.median(values) <= high
    assert stats.median_ci(values) == (low, high)


def test_relative_change_direction_and_zero() -> None:
    assert stats.relative_change(10.0, 12.0) == pytest.approx(0.2)
    assert stats.relative_change(0.0, 0.0) == 0.0
    assert math.isinf(stats.relative_change(0.0, 1.0))


@pytest.mark.parametrize(
    ("better", "scale", "expected"),
    [("lower", 1.2, Status.REGRESSED), ("lower", 0.8, Status.IMPROVED), ("lower", 1.05, Status.PASS),
     ("higher", 0.8, Status.REGRESSED), ("higher", 1.2, Status.IMPROVED), ("higher", 0.95, Status.PASS)],
)
def test_verdict_is_direction_aware(better: str, scale: float, expected: Status) -> None:
    base = stats.summarize([10.0, 10.1, 9.9, 10.0, 10.05])
    cur = stats.summarize([x * scale for x in [10.0, 10.1, 9.9, 10.0, 10.05]])
    assert judge("k", "m", "us", better, cur, base, Threshold(0.1)).status is expected


def test_absolute_tolerance_and_noise_widen_the_threshold() -> None:
    base = stats.summarize([1.0] * 5)
    cur = stats.summarize([1.5] * 5)
    assert judge("k", "m", "us", "lower", cur, base, Threshold(0.1)).status is Status.REGRESSED
    assert judge("k", "m", "us", "lower", cur, base, Threshold(0.1, abs_tolerance=1.0)).status is Status.PASS
    noisy = stats.summarize([0.5, 0.8, 1.0, 1.3, 1.6])  # IQR/median = 0.5
    verdict = judge("k", "m", "us", "lower", cur, noisy, Threshold(0.1, noise_k=1.5))
    assert verdict.allowed == pytest.approx(0.75) and verdict.status is Status.PASS


def test_verdict_round_trips_and_new_has_no_baseline() -> None:
    cur = stats.summarize([3.0, 3.1])
    new = judge("k", "m", "us", "lower", cur, None, Threshold(0.1))
    assert new.status is Status.NEW and "NEW" in new.message()
    assert type(new).from_json(json.loads(json.dumps(new.to_json()))) == new
    assert worst([Status.PASS, Status.IMPROVED, Status.NEW]) is Status.IMPROVED
    assert worst([]) is Status.PASS


def test_threshold_rejects_negative_values() -> None:
    with pytest.raises(ValueError, match="tolerance must be >= 0"):
        Threshold(-0.1)


def test_measurement_validates_its_input() -> None:
    with pytest.raises(ValueError, match="not a finite number"):
        Measurement("t.py::t", "x", (float("nan"),), "us", "lower")
    with pytest.raises(ValueError, match="better must be"):
        Measurement("t.py::t", "x", (1.0,), "us", "faster")  # type: ignore[arg-type]
    assert Measurement("suites/gemm/test_gemm.py::test_a[x]", "t", (1.0,), "us", "lower").suite == "test_gemm"


@pytest.mark.parametrize(
    ("name", "short"),
    [("NVIDIA H200", "h200"), ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "rtx-pro-6000"),
     ("NVIDIA H100 80GB HBM3", "h100-80gb-hbm3"), ("NVIDIA GeForce RTX 5090", "rtx-5090")],
)
def test_short_gpu_names(name: str, short: str) -> None:
    assert topology.short_gpu_name(name) == short


def _two_h200(link_kind: str) -> topology.Topology:
    gpus = tuple(topology.Gpu(index=i, name="NVIDIA H200", memory_bytes=143771 * 2**20, compute_capability=(9, 0))
                 for i in range(2))
    link = topology.Link(0, 1, link_kind, nvlinks=18 if link_kind == "NVLINK" else 0, p2p=True)
    host = topology.Host("Test CPU", "x86_64", 32, 256 * 2**30)
    return topology.Topology(gpus=gpus, links=(link,), host=host, software={"torch": "2.11.0"})


def test_fingerprint_slugs_and_hash_follow_hardware_not_software() -> None:
    nv = _two_h200("NVLINK")
    assert nv.fingerprint.slug == "2x-h200-nvlink" and nv.interconnect == "nvlink"
    assert _two_h200("SYS").fingerprint.slug == "2x-h200-pcie"
    assert _two_h200("SYS").fingerprint.hash != nv.fingerprint.hash
    upgraded = topology.Topology(gpus=nv.gpus, links=nv.links, host=nv.host, software={"torch": "2.13.0"})
    assert upgraded.fingerprint == nv.fingerprint, "software is provenance, not part of the key"
    cpu = topology.Topology(gpus=(), links=(), host=nv.host)
    assert cpu.fingerprint.slug == "cpu-x86-64-32c" and cpu.interconnect == "none"


def test_topology_file_round_trip(tmp_path: Path) -> None:
    nv = _two_h200("NVLINK")
    path = tmp_path / "t.json"
    path.write_text(json.dumps(nv.to_json()))
    loaded = topology.load_topology(path)
    assert loaded.simulated and loaded.gpus == nv.gpus and loaded.links == nv.links
    assert loaded.fingerprint == nv.fingerprint
    assert "NV18" in "\n".join(topology.render(loaded))


def test_bundled_box_is_eight_pcie_blackwell_gpus() -> None:
    box = topology.load_topology("8x-rtx-pro-6000-pcie")
    assert box.gpu_count == 8 and box.interconnect == "pcie"
    assert {g.arch for g in box.gpus} == {"sm120"}
    assert box.fingerprint.slug == "8x-rtx-pro-6000-pcie"


def _m(test: str, name: str, value: float) -> Measurement:
    return Measurement(f"suites/x/test_s.py::{test}", name, (value, value), "us", "lower")


def test_store_update_merges_and_refuses_a_corrupt_file(tmp_path: Path) -> None:
    store = baselines.BaselineStore(tmp_path, "cpu-x")
    fp = {"slug": "cpu-x", "hash": "abc"}
    store.update([_m("a", "t", 1.0), _m("b", "t", 2.0)], fp, {"date": "d"})
    store.update([_m("a", "t", 3.0)], fp, {"date": "e"})
    entries = baselines.read_file(store.path("test_s")).entries
    assert entries["suites/x/test_s.py::a::t"].summary.median == 3.0
    assert entries["suites/x/test_s.py::b::t"].summary.median == 2.0
    store.path("test_s").write_text("garbage")
    with pytest.raises(baselines.BaselineError, match="test_s.json is corrupt"):
        store.update([_m("a", "t", 4.0)], fp, {})
    assert store.path("test_s").read_text() == "garbage"


def test_diff_trees_reports_added_removed_changed() -> None:
    def entry(key: str, value: float) -> baselines.BaselineEntry:
        return baselines.BaselineEntry(key, "t", "n", "us", "lower", stats.summarize([value]))

    old = {"fp/s": {"a": entry("a", 1.0), "b": entry("b", 2.0)}}
    new = {"fp/s": {"a": entry("a", 1.5), "c": entry("c", 3.0)}}
    changes = {c.key: c for c in baselines.diff_trees(old, new)}
    assert changes["a"].kind == "changed" and changes["a"].relative == pytest.approx(0.5)
    assert changes["b"].kind == "removed" and changes["c"].kind == "added"
