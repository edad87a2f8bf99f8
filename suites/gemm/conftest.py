"""Fixtures of the GEMM suite: the device the kernels run on and its roofline figures."""

from __future__ import annotations

import pytest

from pytest_moeperf.devices import DeviceSpec, cpu_device, cuda_device
from pytest_moeperf.gemm import default_device

DEVICE = default_device()


@pytest.fixture(scope="session")
def gemm_device() -> str:
    """``"cuda"`` when torch sees a GPU, else ``"cpu"``; skips the suite when torch is missing."""
    if DEVICE == "none":
        pytest.skip("the GEMM suite needs torch (pip install pytest-moeperf[cpu] or [gpu])")
    return DEVICE


@pytest.fixture(scope="session")
def device_spec(gemm_device: str) -> DeviceSpec:
    """Peak bandwidth / FLOP/s (datasheet) and cache size of the device the GEMMs run on."""
    if gemm_device == "cuda":
        return cuda_device(0)
    import platform

    return cpu_device(platform.processor() or platform.machine())
