"""What fits on one box (GPU memory shares, one CPU server), which servers start together, and the attach-mode URL
syntax. Pure units: no server starts. (The speed-up now reads the decode windows of one start: the spec-decode
suite.)"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

import pytest

from pytest_moeperf.serving.lifecycle.attach import split_url
from pytest_moeperf.serving.lifecycle.pool import (
    GPU_SHARE_BUDGET,
    Placement,
    ServerPool,
    companions,
    fixes_kv_cache,
    parallel_starts,
    pin_gpus,
    place,
)
from pytest_moeperf.serving.models.profiles import ServeProfile, load_profiles
from pytest_moeperf.settings import parse_server_urls

PROFILES = load_profiles(Path(__file__).parents[2] / "suites" / "serving" / "profiles")


def gpu(name: str, tp: int, share: float) -> ServeProfile:
    return ServeProfile(name=name, model="m", device="cuda", tp=tp, gpus=tp,
                        vllm_args=("--gpu-memory-utilization", str(share)))  # fmt: skip


def test_gpu_shares_sum_to_at_most_the_budget_per_gpu() -> None:
    assert GPU_SHARE_BUDGET == 0.9
    assert place(gpu("a", 1, 0.3), [], 1) == Placement((0,), 0.3)
    assert place(gpu("a", 1, 0.3), [Placement((0,), 0.3), Placement((0,), 0.3)], 1) == Placement((0,), 0.3)
    assert place(gpu("a", 1, 0.3), [Placement((0,), 0.3), Placement((0,), 0.4)], 1) is None
    assert place(gpu("a", 1, 0.3), [Placement((0,), 0.6)], 2) == Placement((1,), 0.3)  # the emptier GPU
    assert place(gpu("tp2", 2, 0.5), [Placement((0,), 0.6)], 2) is None
    assert place(gpu("tp8", 8, 0.92), [], 8) is None  # above the budget on its own: never fits
    assert place(gpu("tp2", 2, 0.2), [], 1) is None


def test_cpu_runs_at_most_a_reference_and_a_candidate() -> None:
    cpu = PROFILES["cpu-tiny-nospec"]
    assert place(cpu, [], 0) == Placement((), 0.0)
    assert place(cpu, [Placement((), 0.0)], 0) == Placement((), 0.0)
    assert place(cpu, [Placement((), 0.0)] * 2, 0) is None


def test_which_pairs_fit_together_on_which_box(tmp_path: Path) -> None:
    def pool(gpus: int) -> ServerPool:
        return ServerPool(PROFILES, timeout_s=1.0, gpu_count=gpus, model_cache=tmp_path, log_dir=tmp_path)

    assert pool(0).fits_together("cpu-tiny-nospec", "cpu-tiny-ngram")  # alternating windows on the CPU box
    assert pool(1).fits_together("gpu-tiny-tp1-nospec", "gpu-tiny-tp1-eagle3")  # 0.2 + 0.2 on one H200
    assert pool(2).fits_together("gpu-tiny-tp2-nospec", "gpu-tiny-tp2-ngram")
    assert not pool(8).fits_together("kimi-k25-tp8-nospec", "kimi-k25-tp8-ngram")  # 0.92 each


class Box:
    """Stands in for the pool's launcher: records which server each window ran on and what was up."""

    def __init__(self, capacity: int) -> None:
        self.capacity, self.up, self.log = capacity, [], []  # type: ignore[var-annotated]

    def __call__(self, name: str, *, keep: Sequence[str] = ()) -> str:  # type: ignore[override]
        if name not in self.up:
            while len(self.up) >= self.capacity:
                self.up.pop(0)
            self.up.append(name)
            self.log.append(f"start {name}")
        return name


def test_server_url_syntax() -> None:
    assert parse_server_urls("http://a:8000/") == ("http://a:8000",)
    assert parse_server_urls("reference=http://a:1, candidate=http://b:2") == (
        "reference=http://a:1", "candidate=http://b:2")  # fmt: skip
    assert split_url("candidate=http://b:2") == ("candidate", "http://b:2")
    assert split_url("http://b:2/?x=1") == (None, "http://b:2/?x=1")
    with pytest.raises(argparse.ArgumentTypeError):
        parse_server_urls("prod=b:2")


def test_servers_are_pinned_to_their_gpus_in_pci_order() -> None:
    assert pin_gpus((0, 1), None) == {"CUDA_VISIBLE_DEVICES": "0,1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    assert pin_gpus((1,), "4,5")["CUDA_VISIBLE_DEVICES"] == "5"  # inside the user's own list


def test_starts_run_together_only_where_the_host_and_the_gpu_memory_allow() -> None:
    assert (parallel_starts(2), parallel_starts(16), parallel_starts(32)) == (1, 4, 8)
    tp1 = [PROFILES[f"gpu-tiny-tp1-{s}"] for s in ("nospec", "ngram", "draft", "eagle3")]
    assert all(fixes_kv_cache(p) for p in tp1)  # vLLM sizes their KV cache from the argument, not from free memory
    first = (tp1[0], Placement((0,), 0.2))
    # 1x H200 with 16 CPUs: the four TP=1 profiles start at once (0.8 of the GPU in all)
    group = companions(first, tp1, [], gpu_count=1, parallel=4)
    assert [p.name for p, _ in group] == [p.name for p in tp1[1:]] and all(s == Placement((0,), 0.2) for _, s in group)
    assert companions(first, tp1, [], gpu_count=1, parallel=1) == []  # a 2-core box: one at a time
    assert len(companions(first, tp1, [Placement((0,), 0.4)], gpu_count=1, parallel=4)) == 1  # room for one more
    profiled = gpu("profiled", 1, 0.2)  # sizes its KV cache from the free memory: never beside another start
    assert companions((profiled, Placement((0,), 0.2)), tp1, [], gpu_count=1, parallel=4) == []
    assert companions(first, [profiled, tp1[1]], [], gpu_count=1, parallel=4) == [(tp1[1], Placement((0,), 0.2))]
    cpu = PROFILES["cpu-tiny-nospec"]
    assert companions((cpu, Placement((), 0.0)), [PROFILES["cpu-tiny-ngram"]], [], gpu_count=0, parallel=2) == [
        (PROFILES["cpu-tiny-ngram"], Placement((), 0.0))]
