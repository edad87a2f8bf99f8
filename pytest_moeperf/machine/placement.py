"""One GPU per xdist worker, and GPU locks so that measurements never share a GPU.

- Worker ``gwN`` gets GPU N: ``CUDA_VISIBLE_DEVICES`` is set in the worker's ``pytest_configure``, before
  anything initialises CUDA (``CUDA_DEVICE_ORDER=PCI_BUS_ID`` too, so CUDA and NVML count GPUs alike). The
  full list stays in ``MOEPERF_ALL_GPUS`` for rank subprocesses of multi-GPU tests (rank r: device r of it).
- Every test on a GPU box holds an exclusive ``fcntl`` lock on its GPU for its setup, call and teardown; a
  test marked ``gpus(n)`` with n > 1 holds the locks of all GPUs (taken in ascending order: no deadlock), so
  it runs alone. The lock directory is created by the controller and handed to workers in ``workerinput``.
- More workers than GPUs is a usage error unless ``--moeperf-share-gpus``: then worker N gets GPU
  N mod count, and the locks make the workers sharing a GPU take turns measuring.
- ``-n auto`` starts one worker per GPU. CPU-only boxes (no GPU in the topology): nothing is placed or
  locked, and ``-n auto`` counts CPUs as usual.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Generator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ALL_GPUS_ENV = "MOEPERF_ALL_GPUS"
LOCK_DIR_KEY = "moeperf_gpu_lock_dir"
CONTROLLER_KEY = "moeperf_controller_pid"


# --------------------------------------------------------------------------------------------- pure rules
def worker_number(workerid: str) -> int:
    """``gw0`` → 0, ``gw11`` → 11."""
    match = re.fullmatch(r"gw(\d+)", workerid)
    if match is None:
        raise ValueError(f"not an xdist worker id: {workerid!r}")
    return int(match.group(1))


def device_list(cuda_visible: str | None, gpu_count: int) -> tuple[str, ...]:
    """The devices this session may use: the user's ``CUDA_VISIBLE_DEVICES`` entries, else ``0..count-1``."""
    if cuda_visible is not None and cuda_visible.strip():
        return tuple(d.strip() for d in cuda_visible.split(",") if d.strip())
    return tuple(str(i) for i in range(gpu_count))


def worker_slot(number: int, devices: int, share: bool) -> int:
    """The position in the device list that worker ``number`` measures on."""
    if devices <= 0:
        raise ValueError("no GPU to place a worker on")
    if number >= devices and not share:
        raise ValueError(f"worker gw{number} has no GPU of its own ({devices} GPU(s))")
    return number % devices


def worker_count_error(workers: int, devices: int, share: bool) -> str | None:
    """Why ``workers`` xdist workers cannot each have a GPU of their own, or None."""
    if devices == 0 or workers <= devices or share:
        return None
    return (f"-n {workers}: {workers} xdist workers but {devices} GPU(s); each worker measures on a GPU of its "
            f"own, so use -n {devices} or fewer, or pass --moeperf-share-gpus to let workers take turns on "
            "shared GPUs")


def gpus_needed(item: pytest.Item) -> int:
    """How many GPUs a test uses: its ``gpus(n)`` marker (the largest), else 1. A malformed marker counts as 1
    (the marker check reports it)."""
    need = 1
    for marker in item.iter_markers("gpus"):
        try:
            need = max(need, int(marker.args[0] if marker.args else marker.kwargs.get("n", 1)))
        except (TypeError, ValueError):
            continue
    return need


def lock_set(need: int, own: int, devices: int) -> tuple[int, ...]:
    """The GPU locks a test holds: its own GPU, or all of them when it needs more than one."""
    return tuple(range(devices)) if need > 1 else (own,)


# --------------------------------------------------------------------------------------------- state
@dataclass(frozen=True)
class Placement:
    """Where this process measures. ``own`` is a position in ``devices`` (None: not placed, GPU 0 is used)."""

    devices: tuple[str, ...]
    own: int | None = None
    share: bool = False
    lock_dir: Path | None = None
    controller_pid: int | None = None

    @property
    def dedicated(self) -> bool:
        """A worker with a GPU no other worker uses."""
        return self.own is not None and not self.share

    def item_slots(self, item: pytest.Item) -> tuple[int, ...]:
        """Positions in ``devices`` that ``item`` measures on (empty on a CPU-only box)."""
        if not self.devices:
            return ()
        need = gpus_needed(item)
        if need > 1:
            return tuple(range(min(need, len(self.devices))))
        return (self.own or 0,)

    def nvml_indices(self, item: pytest.Item) -> tuple[int, ...]:
        """NVML indices of ``item``'s GPUs (entries that are not plain indices, e.g. UUIDs, are left out)."""
        return tuple(int(self.devices[s]) for s in self.item_slots(item) if self.devices[s].isdigit())


class GpuLocks:
    """Exclusive cross-process locks, one file per GPU position, taken in ascending order."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def hold(self, slots: Sequence[int]) -> ExitStack:
        import fcntl  # POSIX only: imported where used, so the plugin still loads elsewhere

        stack = ExitStack()
        try:
            for slot in sorted(set(slots)):
                handle = stack.enter_context(open(self.directory / f"gpu{slot}.lock", "a+b"))
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        except BaseException:
            stack.close()
            raise
        return stack


class PlacementPlugin:
    def __init__(self, placement: Placement) -> None:
        self.placement = placement
        self.made_dir: Path | None = None

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        """Controller side of xdist: tell each worker where the locks are and which session it belongs to."""
        if self.placement.lock_dir is not None:
            node.workerinput[LOCK_DIR_KEY] = str(self.placement.lock_dir)
        node.workerinput[CONTROLLER_KEY] = os.getpid()

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, Any, Any]:
        if self.placement.lock_dir is None or not self.placement.devices:
            return (yield)
        slots = lock_set(gpus_needed(item), self.placement.own or 0, len(self.placement.devices))
        with GpuLocks(self.placement.lock_dir).hold(slots):
            return (yield)

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Generator[None, None, None]:
        from pytest_moeperf.runtime import perf_key

        perf = item.stash.get(perf_key, None)
        slots = self.placement.item_slots(item)
        if perf is not None and slots:
            perf.context(gpu_index=",".join(self.placement.devices[s] for s in slots))
        return (yield)

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        if self.made_dir is not None:
            shutil.rmtree(self.made_dir, ignore_errors=True)


def _xdist_workers(config: pytest.Config) -> int:
    if config.getoption("dist", "no") == "no":
        return 0
    return len(config.getoption("tx", None) or [])


def install(config: pytest.Config, gpu_count: int, share: bool) -> Placement:
    """Place this process (controller or worker) and register the plugin; raise UsageError for too many workers."""
    devices = device_list(os.environ.get("CUDA_VISIBLE_DEVICES"), gpu_count) if gpu_count else ()
    workerinput: dict[str, Any] | None = getattr(config, "workerinput", None)
    made: Path | None = None
    if workerinput is None:  # the controller, or a run without xdist
        workers = _xdist_workers(config)
        error = worker_count_error(workers, len(devices), share)
        if error is not None:
            raise pytest.UsageError(error)
        if workers and devices:
            made = Path(tempfile.mkdtemp(prefix="moeperf-gpu-locks-"))
        placement = Placement(devices=devices, share=share, lock_dir=made)
    else:
        own = None
        if devices:
            own = worker_slot(worker_number(str(workerinput["workerid"])), len(devices), share)
            os.environ.setdefault(ALL_GPUS_ENV, ",".join(devices))
            os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
            os.environ["CUDA_VISIBLE_DEVICES"] = devices[own]
        lock_dir = workerinput.get(LOCK_DIR_KEY)
        controller = workerinput.get(CONTROLLER_KEY)
        placement = Placement(devices=devices, own=own, share=share, lock_dir=Path(lock_dir) if lock_dir else None,
                              controller_pid=int(controller) if controller is not None else None)
    plugin = PlacementPlugin(placement)
    plugin.made_dir = made
    config.pluginmanager.register(plugin, "moeperf-placement")
    return placement


def auto_workers(config: pytest.Config) -> int | None:
    """``-n auto`` on a GPU box: one worker per GPU (None on a CPU-only box: xdist counts CPUs)."""
    from pytest_moeperf import settings as settings_mod
    from pytest_moeperf.machine import probe as probe_mod
    from pytest_moeperf.machine import topology as topology_mod

    topology_file = settings_mod.resolve(config).topology_file
    try:
        if topology_file is not None:
            count = topology_mod.load_topology(topology_file).gpu_count
        else:
            found = probe_mod.probe_nvml()
            count = len(found[0]) if found else 0
    except topology_mod.TopologyError:
        return None  # reported by pytest_configure
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return len(device_list(visible, count)) if count else None


def session_roots(placement: Placement) -> tuple[int, ...]:
    """The processes whose trees count as ours for the health gate: this process, and under xdist the whole
    session (controller and workers): workers are never each other's foreign load. With a GPU each, they measure
    apart; on a CPU box they share the cores, which the report header says (`shared_cores_note`)."""
    if placement.controller_pid is not None:
        return (os.getpid(), placement.controller_pid)
    return (os.getpid(),)


def shared_cores_note(config: pytest.Config, placement: Placement) -> str | None:
    """What the header says when xdist workers measure on shared CPU cores (no GPU each)."""
    if placement.devices or not (_xdist_workers(config) or getattr(config, "workerinput", None)):
        return None
    return ("moeperf: xdist workers share this machine's CPU cores and disturb each other's timings; the health "
            "gate counts them as ours (use -n 0 for CPU baselines)")
