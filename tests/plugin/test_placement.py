"""One GPU per xdist worker: the placement rules (pure), the GPU locks (real fcntl locks), and real xdist
sessions on the bundled 2x H200 topology (simulated: placement and locks act, measurements skip)."""

from __future__ import annotations

import fcntl
import json
import os
from importlib import metadata
from pathlib import Path

import pytest

from pytest_moeperf.machine.placement import (
    GpuLocks,
    Placement,
    PlacementPlugin,
    device_list,
    gpus_needed,
    lock_set,
    session_roots,
    worker_count_error,
    worker_number,
    worker_slot,
)
from pytest_moeperf.perf import Perf
from pytest_moeperf.runtime import perf_key

#: load the plugin from the checkout unless it is installed (its pytest11 entry point registers it then)
PLUGIN: tuple[str, ...] = () if any(ep.value == "pytest_moeperf.plugin" for ep in metadata.entry_points(
    group="pytest11")) else ("-p", "pytest_moeperf.plugin")


# --------------------------------------------------------------------------------------------- pure rules
def test_worker_ids_map_to_gpu_positions() -> None:
    assert [worker_number(w) for w in ("gw0", "gw1", "gw11")] == [0, 1, 11]
    with pytest.raises(ValueError, match="not an xdist worker id"):
        worker_number("master")
    assert worker_slot(1, 2, share=False) == 1
    assert worker_slot(3, 2, share=True) == 1
    with pytest.raises(ValueError, match="gw2 has no GPU of its own"):
        worker_slot(2, 2, share=False)


def test_the_device_list_honours_the_users_cuda_visible_devices() -> None:
    assert device_list(None, 2) == ("0", "1")
    assert device_list("", 2) == ("0", "1")
    assert device_list("2, 3", 8) == ("2", "3")
    assert device_list(None, 0) == ()


def test_too_many_workers_is_refused_unless_shared_and_cpu_boxes_are_free() -> None:
    message = worker_count_error(3, 2, share=False)
    assert message is not None and message.startswith("-n 3: 3 xdist workers but 2 GPU(s)")
    assert "--moeperf-share-gpus" in message
    assert worker_count_error(2, 2, share=False) is None
    assert worker_count_error(3, 2, share=True) is None
    assert worker_count_error(4, 0, share=False) is None  # CPU-only box: no restriction


def test_a_multi_gpu_test_locks_every_gpu_a_single_gpu_test_its_own(pytester: pytest.Pytester) -> None:
    single, double, bad = pytester.getitems("""
        import pytest
        def test_single(): pass
        @pytest.mark.gpus(2)
        def test_double(): pass
        @pytest.mark.gpus("two")
        def test_bad(): pass
    """)
    assert [gpus_needed(i) for i in (single, double, bad)] == [1, 2, 1]
    assert lock_set(1, own=1, devices=4) == (1,)
    assert lock_set(2, own=1, devices=4) == (0, 1, 2, 3)
    placed = Placement(devices=("2", "3"), own=1)
    assert placed.item_slots(single) == (1,) and placed.item_slots(double) == (0, 1)
    assert placed.nvml_indices(single) == (3,) and placed.nvml_indices(double) == (2, 3)
    assert Placement(devices=()).item_slots(double) == ()


def test_xdist_workers_are_never_each_others_foreign_load() -> None:
    """The fault sweep: under ``pytest -n 2`` on a CPU box each worker counted the other as foreign CPU, so every
    metric was INCONCLUSIVE and an update wrote nothing. The whole xdist session is ours, GPUs or not."""
    assert session_roots(Placement(devices=("0", "1"), own=1, controller_pid=42)) == (os.getpid(), 42)
    assert session_roots(Placement(devices=("0",), own=0, share=True, controller_pid=42)) == (os.getpid(), 42)
    assert session_roots(Placement(devices=(), controller_pid=42)) == (os.getpid(), 42)
    assert session_roots(Placement(devices=())) == (os.getpid(),)


def test_the_gpu_a_test_ran_on_goes_into_its_metrics_context(pytester: pytest.Pytester) -> None:
    item = pytester.getitem("def test_func(): pass")
    perf = Perf(item.nodeid)
    item.stash[perf_key] = perf
    wrapper = PlacementPlugin(Placement(devices=("0", "1"), own=1)).pytest_runtest_call(item)
    next(wrapper)
    assert perf.record("latency", [1.0], unit="ms").context == {"gpu_index": "1"}
    with pytest.raises(StopIteration):
        wrapper.send(None)


# --------------------------------------------------------------------------------------------- locks
def test_gpu_locks_are_exclusive_across_open_files(tmp_path: Path) -> None:
    def free(slot: int) -> bool:
        with open(tmp_path / f"gpu{slot}.lock", "a+b") as handle:
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
            return True

    locks = GpuLocks(tmp_path)
    with locks.hold([1]):
        assert not free(1) and free(0)
    with locks.hold([1, 0]):
        assert not free(0) and not free(1)
    assert free(0) and free(1)


# --------------------------------------------------------------------------------------------- sessions
def run_xdist(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    pytest.importorskip("xdist")
    return pytester.runpytest_subprocess(*PLUGIN, "-p", "no:cacheprovider",
                                         "--moeperf-topology", "2x-h200-nvlink", *args, timeout=300)


def test_more_workers_than_gpus_is_refused_with_the_way_out(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_x(): pass")
    result = run_xdist(pytester, "-n", "3")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: -n 3: 3 xdist workers but 2 GPU(s); each worker measures on a GPU of its "
                                 "own, so use -n 2 or fewer, or pass --moeperf-share-gpus*"])
    shared = run_xdist(pytester, "-n", "3", "--moeperf-share-gpus")
    shared.assert_outcomes(passed=1)


ENV_TESTS = """
import json, os, time
import pytest


def write(worker_id, name):
    time.sleep(0.3)
    out = {"worker": worker_id, "cvd": os.environ.get("CUDA_VISIBLE_DEVICES"),
           "all": os.environ.get("MOEPERF_ALL_GPUS"), "order": os.environ.get("CUDA_DEVICE_ORDER")}
    with open(f"{name}.json", "w") as handle:
        json.dump(out, handle)

@pytest.mark.parametrize("i", range(6))
def test_single(worker_id, i):
    start = time.time()
    write(worker_id, f"single{i}")
    with open(f"span-single{i}.json", "w") as handle:
        json.dump([start, time.time()], handle)

@pytest.mark.gpus(2)
def test_double(worker_id):
    start = time.time()
    write(worker_id, "double")
    with open("span-double.json", "w") as handle:
        json.dump([start, time.time()], handle)
"""


def test_each_worker_sees_its_own_gpu_and_a_two_gpu_test_runs_alone(pytester: pytest.Pytester,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("MOEPERF_ALL_GPUS", raising=False)
    pytester.makepyfile(test_env=ENV_TESTS)
    run_xdist(pytester, "-n", "2").assert_outcomes(passed=7)
    seen = [json.loads(p.read_text()) for p in pytester.path.glob("s*.json") if not p.name.startswith("span")]
    seen.append(json.loads((pytester.path / "double.json").read_text()))
    assert len(seen) == 7
    for env in seen:
        assert env["cvd"] == env["worker"].removeprefix("gw"), env  # gw0 -> GPU 0, gw1 -> GPU 1
        assert env["all"] == "0,1" and env["order"] == "PCI_BUS_ID"
    double = json.loads((pytester.path / "span-double.json").read_text())
    for path in pytester.path.glob("span-single*.json"):
        start, end = json.loads(path.read_text())
        assert end <= double[0] or start >= double[1], (path.name, (start, end), double)


def test_n_auto_starts_one_worker_per_gpu(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_x(): pass")
    result = run_xdist(pytester, "-n", "auto")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*2 workers [[]1 item[]]*"])


def test_a_cpu_only_box_places_nothing(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("xdist")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    pytester.makepyfile("""
        import os
        def test_env(topology):
            assert topology.gpu_count == 0
            assert "CUDA_VISIBLE_DEVICES" not in os.environ and "MOEPERF_ALL_GPUS" not in os.environ
    """)
    topo = pytester.path / "cpu.json"
    topo.write_text(json.dumps({"schema": 1, "gpus": [], "links": []}))
    result = pytester.runpytest_subprocess(*PLUGIN, "-p", "no:cacheprovider",
                                           "--moeperf-topology", str(topo), "-n", "3", timeout=300)
    result.assert_outcomes(passed=1)
