"""Fixtures of the GEMM suite: the device the kernels run on and its roofline figures."""

from __future__ import annotations

import platform

import pytest

from pytest_moeperf.kernels.devices import DeviceSpec, cpu_device, cuda_device
from pytest_moeperf.kernels.gemm import default_device


@pytest.fixture(scope="session")
def gemm_device() -> str:
    """``"cuda"`` when torch sees a GPU, else ``"cpu"``; skips the suite when torch is missing."""
    device = default_device()
    if device == "none":
        pytest.skip("the GEMM suite needs torch (pip install pytest-moeperf[cpu] or [gpu])")
    return device


@pytest.fixture(scope="session")
def device_spec(gemm_device: str) -> DeviceSpec:
    """Peak bandwidth / FLOP/s (datasheet) and cache size of the device the GEMMs run on."""
    if gemm_device == "cuda":
        return cuda_device(0)
    return cpu_device(platform.processor() or platform.machine())
