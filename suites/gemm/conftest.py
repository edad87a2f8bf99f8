"""Fixtures of the GEMM suite: the device the kernels run on, its roofline figures, and a wall-clock deadline.

``MOEPERF_GEMM_DEADLINE`` (Unix time, seconds): once passed, the remaining GEMM cases skip with that reason, so
a batch with a fixed time slot still ends its session normally and writes its report and baselines.
"""

from __future__ import annotations

import os
import platform
import time

import pytest

from pytest_moeperf.devices import DeviceSpec, cpu_device, cuda_device
from pytest_moeperf.gemm import default_device

DEADLINE_ENV = "MOEPERF_GEMM_DEADLINE"


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


@pytest.fixture(autouse=True)
def _gemm_deadline() -> None:
    raw = os.environ.get(DEADLINE_ENV)
    if not raw:
        return
    try:
        deadline = float(raw)
    except ValueError:
        raise pytest.UsageError(f"{DEADLINE_ENV}={raw!r} is not a Unix time in seconds") from None
    if time.time() > deadline:
        pytest.skip(f"{DEADLINE_ENV} passed: the batch's time slot is used up")
