"""Roofline figures per device: peak memory bandwidth, dense bf16 FLOP/s and last-level cache size.

Figures come from vendor datasheets and say so (``source="datasheet"``); a device we have no figure for gets
``None`` fields (``source="unknown"``) and roofline percentages are then not reported. Cache sizes are taken
from the running device when it can tell (``torch.cuda.get_device_properties().L2_cache_size``, Linux sysfs for
the CPU's last-level cache) and from the table otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

__all__ = ["DeviceSpec", "DATASHEET", "cpu_device", "cuda_device", "lookup", "roofline_pct"]

MiB = 1 << 20


@dataclass(frozen=True)
class DeviceSpec:
    name: str
    mem_bw_bytes_s: float | None  # peak DRAM/HBM bandwidth
    bf16_flops: float | None  # dense bf16 tensor FLOP/s, fp32 accumulate
    cache_bytes: int | None  # last-level cache (L2 on GPUs)
    source: str  # "datasheet", "device", "unknown"

    @property
    def has_roofline(self) -> bool:
        return self.mem_bw_bytes_s is not None


# Matched by substring of the device name, first match wins (so "H100 PCIe" precedes "H100").
DATASHEET: tuple[tuple[str, DeviceSpec], ...] = (
    ("H200", DeviceSpec("NVIDIA H200", 4.8e12, 989e12, 50 * MiB, "datasheet")),
    ("H100 PCIe", DeviceSpec("NVIDIA H100 PCIe", 2.0e12, 756e12, 50 * MiB, "datasheet")),
    ("H100 NVL", DeviceSpec("NVIDIA H100 NVL", 3.9e12, 835e12, 50 * MiB, "datasheet")),
    ("H100", DeviceSpec("NVIDIA H100 SXM", 3.35e12, 989e12, 50 * MiB, "datasheet")),
    (
        "RTX PRO 6000 Blackwell",
        DeviceSpec("NVIDIA RTX PRO 6000 Blackwell", 1.792e12, 503.8e12, 128 * MiB, "datasheet"),
    ),
)


def lookup(name: str) -> DeviceSpec:
    """The datasheet entry whose key occurs in ``name`` (case-insensitive), else an ``unknown`` spec."""
    lowered = name.lower()
    for key, spec in DATASHEET:
        if key.lower() in lowered:
            return replace(spec, name=name)
    return DeviceSpec(name, None, None, None, "unknown")


def cuda_device(index: int = 0) -> DeviceSpec:
    """The spec of CUDA device ``index``, with the L2 size the device reports."""
    import torch

    props = torch.cuda.get_device_properties(index)
    spec = lookup(props.name)
    l2 = int(getattr(props, "L2_cache_size", 0) or 0)
    return replace(spec, cache_bytes=l2) if l2 else spec


def _sysfs_llc_bytes() -> int | None:
    best: int | None = None
    for index in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            text = (index / "size").read_text().strip()
        except OSError:
            continue
        units = {"K": 1 << 10, "M": MiB, "G": 1 << 30}
        value = int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)
        best = value if best is None or value > best else best
    return best


def cpu_device(name: str = "cpu") -> DeviceSpec:
    """The host CPU: no datasheet figures (roofline not reported), last-level cache from sysfs."""
    return DeviceSpec(name, None, None, _sysfs_llc_bytes(), "unknown")


def roofline_pct(achieved_bytes_s: float, spec: DeviceSpec) -> float | None:
    """Achieved bandwidth as a percentage of the device's peak, or ``None`` when the peak is unknown."""
    if spec.mem_bw_bytes_s is None:
        return None
    return 100.0 * achieved_bytes_s / spec.mem_bw_bytes_s
