"""Fixtures of the GEMM suite: the device the kernels run on, its roofline figures, and the all-reduce baselines
the budget guard depends on."""

from __future__ import annotations

import platform

import pytest

from pytest_moeperf.kernels.budget import AllReducePoint, allreduce_points_from_store
from pytest_moeperf.kernels.budget.inputs import ALLREDUCE_SUITE
from pytest_moeperf.kernels.devices import DeviceSpec, cpu_device, cuda_device
from pytest_moeperf.kernels.gemm import default_device
from pytest_moeperf.machine.topology import Topology
from pytest_moeperf.settings import Settings
from pytest_moeperf.store.baselines import BaselineStore


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


@pytest.fixture(scope="session")
def allreduce_baselines(moeperf_settings: Settings, topology: Topology) -> list[AllReducePoint]:
    """The all-reduce points this fingerprint's baselines hold (written by ``suites/allreduce``, read through the
    baseline store). Skips when there are none: the budget guard depends on them."""
    store = BaselineStore(moeperf_settings.baselines_dir, topology.fingerprint.slug)
    points = allreduce_points_from_store(store)
    if not points:
        pytest.skip(f"depends on the all-reduce baselines of fingerprint {store.slug} ({store.path(ALLREDUCE_SUITE)}),"
                    " which hold no all-reduce latency: run suites/allreduce with --moeperf-update first")
    return points
