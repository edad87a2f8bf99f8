"""Server starts of one profile, each with two short windows: the start's phases and the start-to-start spread of
TPOT (a benchmark the lead runs on a GPU, not a timed test).

N starts of ``--profile`` one after another (the first on an empty compile cache unless ``--cache-dir`` names a warm
one, the rest warm), each followed by closed-loop windows (``--window C:REQUESTS``, default c=1 and c=16, each after
a warm pass of its own shape). ``--vary KEY=A,B`` alternates a knob across starts (start i takes value i mod n):
``cpu_placement`` (off, auto), ``async_scheduling`` (on, off, default), ``cudagraph_batches`` (profile, vllm: vLLM's
own list), or ``env.NAME``. A knob that changes vLLM's config (async scheduling, graph sizes) compiles cold on its
first start: the spread is computed over the warm starts of each setting. Everything goes under ``--out`` (at most
8 files, flat; rewritten after every start, so a run cut short keeps what it measured): ``serve_starts.json``,
``serve_starts.md`` (the phase table per start, the spread per setting), ``serve_starts.log`` (every start's server
log, one after another). A short table is printed last.

    # on 1x H200 (vLLM carried in /tmp/site; est. 50-80 s a start, ~20 s of windows): one ≤10-minute call
    PYTHONPATH=/tmp/site:. python tests/benchmarks/serve_starts.py --profile gpu-tiny-tp1-nospec --starts 7 \\
        --vary cpu_placement=off,auto --deadline 540 --out $OUT
    # on the CPU box (2 minutes a start)
    PYTHONPATH=. .tox/tests/bin/python tests/benchmarks/serve_starts.py --profile cpu-tiny-nospec --starts 2 \\
        --window 1:8 --window 4:16 --input-len 128 --output-len 64 --out /tmp/starts

Spread: max/min and the robust CV (1.4826 x MAD / median) of the server's own mean TPOT (``/metrics``) and of the
client's median and mean TPOT per window. Results: docs/measurements/starts.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from pytest_moeperf.machine import probe
from pytest_moeperf.serving.analysis.metrics import latency_samples
from pytest_moeperf.serving.lifecycle.pool import ServerPool
from pytest_moeperf.serving.lifecycle.served import Served
from pytest_moeperf.serving.lifecycle.server import LaunchedServer
from pytest_moeperf.serving.lifecycle.startlog import PHASES
from pytest_moeperf.serving.lifecycle.starts import gpu_local_cpus
from pytest_moeperf.serving.load.loadgen import ClosedLoop
from pytest_moeperf.serving.load.prompts import spread_outputs
from pytest_moeperf.serving.load.warm import warm_count
from pytest_moeperf.serving.models.profiles import DEFAULT_DIR, ServeProfile, load_profile_dirs

KNOBS = ("cpu_placement", "async_scheduling", "cudagraph_batches")
FIGURES = ("engine_tpot_ms", "client_tpot_median_ms", "client_tpot_mean_ms", "output_tok_s")


def parse_window(text: str) -> tuple[int, int]:
    c, _, n = text.partition(":")
    if not (c.isdigit() and n.isdigit() and int(c) > 0 and int(n) >= int(c)):
        raise argparse.ArgumentTypeError(f"--window {text!r}: expected CONCURRENCY:REQUESTS, requests >= concurrency")
    return int(c), int(n)


def parse_vary(text: str) -> tuple[str, list[str]]:
    key, _, values = text.partition("=")
    if (key not in KNOBS and not key.startswith("env.")) or not values:
        raise argparse.ArgumentTypeError(f"--vary {text!r}: expected KEY=V1,V2 with KEY one of {', '.join(KNOBS)} "
                                         "or env.NAME")
    return key, values.split(",")


def variant(profile: ServeProfile, key: str | None, value: str | None) -> ServeProfile:
    """``profile`` with the knob ``key`` set to ``value`` (unchanged without a knob)."""
    if key is None or value is None:
        return profile
    if key == "cpu_placement":
        return dataclasses.replace(profile, cpu_placement=value)
    if key == "async_scheduling":
        flag = {"on": ("--async-scheduling",), "off": ("--no-async-scheduling",), "default": ()}.get(value)
        if flag is None:
            raise SystemExit(f"serve_starts: --vary async_scheduling={value!r}: expected on, off or default")
        return dataclasses.replace(profile, vllm_args=(*profile.vllm_args, *flag))
    if key == "cudagraph_batches":
        if value not in ("profile", "vllm"):
            raise SystemExit(f"serve_starts: --vary cudagraph_batches={value!r}: expected profile or vllm")
        return profile if value == "profile" else dataclasses.replace(profile, cudagraph_batches=())
    return dataclasses.replace(profile, env={**profile.env, key.removeprefix("env."): value})


def window(served: Served, c: int, n: int, args: argparse.Namespace) -> dict[str, Any]:
    """One closed-loop window of ``n`` requests at concurrency ``c`` after a warm pass of its shape."""
    shape = ClosedLoop(c)
    warm = warm_count(shape, n, 2)
    seed = served.fresh_seed()
    requests = served.random_requests(warm + n, args.input_len, args.output_len, seed=seed)
    spread = args.spread if c > 1 else 0.0
    t0 = time.monotonic()
    result = served.measure(spread_outputs(requests[warm:], spread, seed=seed), shape,
                            warm=spread_outputs(requests[:warm], spread, seed=seed))
    tpot = latency_samples(result.window.outcomes)["tpot"]
    metrics = result.window.metrics
    return {"concurrency": c, "requests": n, "seconds": round(time.monotonic() - t0, 2), "failed": metrics.failed,
            "engine_tpot_ms": result.engine_tpot_ms, "client_tpot_median_ms": statistics.median(tpot) if tpot else None,
            "client_tpot_mean_ms": statistics.fmean(tpot) if tpot else None,
            "output_tok_s": metrics.output_throughput, "compiles_in_window": result.compiles.count}


def spread(values: list[float]) -> dict[str, Any]:
    """n, median, max/min and robust CV (1.4826 x MAD / median) of ``values``."""
    if not values:
        return {"n": 0}
    med = statistics.median(values)
    mad = statistics.median(abs(v - med) for v in values)
    return {"n": len(values), "median": med, "max_over_min": max(values) / min(values) if min(values) > 0 else None,
            "robust_cv": 1.4826 * mad / med if med else None}


def summary(starts: list[dict[str, Any]], windows: list[tuple[int, int]]) -> list[dict[str, Any]]:
    """The spread of each figure per setting and concurrency, over the warm starts (all starts when none is)."""
    rows = []
    for setting in dict.fromkeys(s["setting"] for s in starts):
        mine = [s for s in starts if s["setting"] == setting]
        warm = [s for s in mine if s["compile_cache"] == "warm"] or mine
        for c, _ in windows:
            for figure in FIGURES:
                values = [w[figure] for s in warm for w in s["windows"] if w["concurrency"] == c and w[figure]]
                rows.append({"setting": setting, "starts": "warm" if warm is not mine else "all", "concurrency": c,
                             "figure": figure, **spread(values)})
    return rows


def markdown(run: dict[str, Any]) -> str:
    starts = run["starts"]
    phases = [p for p in PHASES if any(p in s["phases"] for s in starts)]
    lines = [f"# {run['profile']}: {len(starts)} starts ({run['date']}, {run['host']})", "",
             "| start | setting | cache | total s | " + " | ".join(phases) + " | "
             + " | ".join(f"engine TPOT c={c}" for c, _ in run["windows"]) + " |",
             "| --- | --- | --- | ---: | " + " | ".join("---:" for _ in phases) + " | "
             + " | ".join("---:" for _ in run["windows"]) + " |"]
    for s in starts:
        tpots = [next((f"{w['engine_tpot_ms']:.3f}" for w in s["windows"] if w["concurrency"] == c
                       and w["engine_tpot_ms"]), "-") for c, _ in run["windows"]]
        lines.append(f"| {s['index']} | {s['setting']} | {s['compile_cache']} | {s['startup_s']:.1f} | "
                     + " | ".join(f"{s['phases'][p]:.1f}" if p in s["phases"] else "-" for p in phases) + " | "
                     + " | ".join(tpots) + " |")
    lines += ["", "| setting | starts | c | figure | n | median | max/min | robust CV |", "| --- | --- | ---: | --- "
              "| ---: | ---: | ---: | ---: |"]
    for r in run["summary"]:
        if r["n"]:
            ratio = f"{r['max_over_min']:.3f}" if r["max_over_min"] else "-"
            cv = f"{r['robust_cv'] * 100:.1f} %" if r["robust_cv"] is not None else "-"
            lines.append(f"| {r['setting']} | {r['starts']} | {r['concurrency']} | {r['figure']} | {r['n']} | "
                         f"{r['median']:.4g} | {ratio} | {cv} |")
    return "\n".join(lines) + "\n"


def short(run: dict[str, Any]) -> str:
    """The last thing printed: each start's total and cache state, and the TPOT spread per setting."""
    lines = ["start  setting              cache     total s  " + "  ".join(f"engine TPOT c={c:<3}" for c, _ in
                                                                         run["windows"])]
    for s in run["starts"]:
        tpot = [next((w["engine_tpot_ms"] for w in s["windows"] if w["concurrency"] == c), None) for c, _ in
                run["windows"]]
        lines.append(f"{s['index']:>5}  {s['setting']:<20} {s['compile_cache'] or '?':<8} {s['startup_s']:>8.1f}  "
                     + "  ".join(f"{t:>16.3f}" if t else f"{'-':>16}" for t in tpot))
    lines.append("spread over starts   setting              c    figure               n  max/min  robust CV")
    lines += [f"{'':<20} {r['setting']:<20} {r['concurrency']:<4} {r['figure']:<20} {r['n']:>2}  "
              f"{r['max_over_min']:>7.3f}  {r['robust_cv'] * 100:>8.1f} %" for r in run["summary"]
              if r["n"] > 1 and r["figure"] in ("engine_tpot_ms", "client_tpot_median_ms") and r["max_over_min"]
              and r["robust_cv"] is not None]
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--profile", default="gpu-tiny-tp1-nospec")
    p.add_argument("--profiles", type=Path, action="append", help=f"profile directory (default {DEFAULT_DIR})")
    p.add_argument("--starts", type=int, default=4, help="server starts (default %(default)s)")
    p.add_argument("--window", type=parse_window, action="append", metavar="C:REQUESTS",
                   help="closed-loop window after each start (repeatable; default 1:20 and 16:160, ~7 s each on "
                        "1x H200 at 1024 in / 256 out)")
    p.add_argument("--input-len", type=int, default=1024)
    p.add_argument("--output-len", type=int, default=256)
    p.add_argument("--spread", type=float, default=0.25, help="output spread of windows of 2+ clients (the suite's)")
    p.add_argument("--vary", type=parse_vary, help="alternate a knob across starts: KEY=V1,V2")
    p.add_argument("--cache-dir", type=Path, help="compile cache root (default: a new empty one, so start 1 is cold)")
    p.add_argument("--deadline", type=float, default=540.0, help="start no start that would end after this many "
                                                                  "seconds (default %(default)s)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for /health")
    p.add_argument("--out", type=Path, required=True, help="directory for the results (the lead passes $OUT)")
    args = p.parse_args()
    windows = args.window or [(1, 20), (16, 160)]
    if args.starts < 1:
        p.error(f"--starts {args.starts}: at least 1")
    profiles = load_profile_dirs(args.profiles or [DEFAULT_DIR])
    if args.profile not in profiles:
        p.error(f"--profile {args.profile!r}: no such profile; known: {', '.join(sorted(profiles))}")
    args.out.mkdir(parents=True, exist_ok=True)
    cache = args.cache_dir or Path(tempfile.mkdtemp(prefix="moeperf-starts-"))
    topology = probe.probe()
    key, values = args.vary or (None, [None])
    host = f"{topology.host.cpu_model}, {topology.host.cores} CPUs, {topology.gpu_count} GPU(s)"
    run: dict[str, Any] = {"profile": args.profile, "date": time.strftime("%Y-%m-%d %H:%M"), "host": host,
                           "host_id": topology.host.id, "windows": windows,
                           "vary": key, "cache_dir": str(cache), "starts": [], "summary": []}
    t_begin, last = time.monotonic(), 0.0
    log_out = args.out / "serve_starts.log"
    log_out.write_text("")
    for i in range(args.starts):
        value = values[i % len(values)]
        if last and time.monotonic() - t_begin + 1.2 * last > args.deadline:
            print(f"serve_starts: stopping before start {i + 1}: it would end after --deadline {args.deadline:g} s")
            break
        t0 = time.monotonic()
        profile = variant(profiles[args.profile], key, value)
        pool = ServerPool({profile.name: profile}, timeout_s=args.timeout, gpu_count=topology.gpu_count,
                          model_cache=cache / "models", log_dir=Path(tempfile.mkdtemp(prefix="starts-log-")),
                          compile_cache=cache / "vllm", gpu_cpus=gpu_local_cpus(topology))
        served = pool.launch(profile)
        server = served.server
        assert isinstance(server, LaunchedServer)
        try:
            assert served.start is not None and served.startup_s is not None
            info = served.start
            knob = f"{key}={value}, " if key else ""
            print(f"start {i + 1}: {knob}healthy after {served.startup_s:.1f} s, compile cache "
                  f"{info.log.compile_cache}: " + ", ".join(f"{k} {v:.1f}" for k, v in info.log.seconds.items()),
                  flush=True)
            measured = [window(served, c, n, args) for c, n in windows]
            for w in measured:
                print(f"  c={w['concurrency']}: engine TPOT {w['engine_tpot_ms']} ms, client median "
                      f"{w['client_tpot_median_ms']} ms, {w['seconds']} s", flush=True)
        finally:
            server.stop()
            with log_out.open("a") as f:
                f.write(f"===== start {i + 1} ({key}={value}) launched at {server.launched_at:.3f} "
                        f"(epoch s), {server.log_path}\n")
                f.write(server.log_path.read_text(errors="replace"))
        run["starts"].append({"index": i + 1, "setting": f"{key}={value}" if key else "-",
                              "startup_s": served.startup_s, "launched_at": server.launched_at,
                              "compile_cache": info.log.compile_cache, "phases": dict(info.log.seconds),
                              "missing": dict(info.log.missing), "context": info.context(), "windows": measured})
        run["summary"] = summary(run["starts"], windows)
        (args.out / "serve_starts.json").write_text(json.dumps(run, indent=1, sort_keys=True))
        (args.out / "serve_starts.md").write_text(markdown(run))
        last = time.monotonic() - t0
    if not run["starts"]:
        print("serve_starts: no start fitted the deadline", file=sys.stderr)
        return 1
    print(f"wrote {args.out}/serve_starts.json, .md, .log\n" + short(run))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
