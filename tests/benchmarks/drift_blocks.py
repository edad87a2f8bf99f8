"""Are a window's requests independent observations? Measure it on a real server (a benchmark tool, not a test).

Starts a serve profile (``moeperf serve``) or uses ``--url``, runs closed-loop windows after a warm pass, and for
each window prints the drift check counted per request and per block of C requests (`check_drift`), and the
autocorrelation of the requests' TPOT in send order: at lags 1..C+3, and of block medians at lag 1 for blocks of
1, C, 2C and 4C requests. Outcomes (send time, TTFT, latency, tokens) go to ``--out`` as JSON.

    .tox/tests/bin/python tests/benchmarks/drift_blocks.py --profile cpu-tiny-nospec --windows 4:120x5 1:40x2 \\
        --input-len 128 --output-len 64 --out drift-blocks.json

Results: docs/measurements/serving.md ("Drift: a window's requests are not independent observations").
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from pytest_moeperf.serving.analysis.drift import check_drift
from pytest_moeperf.serving.analysis.metrics import RequestOutcome, latency_samples
from pytest_moeperf.serving.load.loadgen import ClosedLoop, LoadGenerator
from pytest_moeperf.serving.load.prompts import random_token_requests


def acf(x: list[float], lag: int) -> float:
    """Sample autocorrelation of ``x`` at ``lag``."""
    mean = statistics.fmean(x)
    var = sum((a - mean) ** 2 for a in x)
    return sum((x[i] - mean) * (x[i + lag] - mean) for i in range(len(x) - lag)) / var if var else 0.0


def tpots(outcomes: list[RequestOutcome], ramp: int) -> list[float]:
    """The steady requests' TPOT in ms, in send order (the ramp left out at each end, as `check_drift` does)."""
    ok = sorted((o for o in outcomes if o.success), key=lambda o: o.start_s)
    return latency_samples(ok[ramp:len(ok) - ramp])["tpot"]


def describe(c: int, outcomes: list[RequestOutcome]) -> str:
    per_request = check_drift(outcomes, ramp=c, min_effects={}).facts()["drift"]
    per_block = check_drift(outcomes, ramp=c, block=c, min_effects={}).facts()["drift"]
    x = tpots(outcomes, c)
    lags = " ".join(f"{acf(x, k):+.2f}" for k in range(1, c + 4))
    blocks = []
    for b in sorted({1, c, 2 * c, 4 * c}):
        med = [statistics.median(x[i:i + b]) for i in range(0, len(x) - b + 1, b)]
        blocks.append(f"{b}: {acf(med, 1):+.2f} ({len(med)})" if len(med) > 3 else f"{b}: - ({len(med)})")
    return (f"  drift per request: {per_request}\n  drift per block:   {per_block}\n"
            f"  TPOT median {statistics.median(x):.3g} ms; ACF lags 1..{c + 3}: {lags}\n"
            f"  block-median ACF at lag 1, by block size (blocks): {'; '.join(blocks)}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--profile", default="cpu-tiny-nospec", help="serve profile to start (default: %(default)s)")
    p.add_argument("--url", help="measure this running server instead of starting one")
    p.add_argument("--windows", nargs="+", default=["4:120x5", "1:40x2"], metavar="C:NxK",
                   help="K windows of N requests at concurrency C (default: %(default)s)")
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--vocab", type=int, default=512, help="token ids drawn from [16, VOCAB) (default: the tiny MoE's)")
    p.add_argument("--out", type=Path, default=Path("drift-blocks.json"))
    args = p.parse_args()
    plan = []
    for spec in args.windows:
        c, _, rest = spec.partition(":")
        n, _, k = rest.partition("x")
        plan += [(int(c), int(n))] * int(k or 1)
    server = None
    with tempfile.TemporaryDirectory(prefix="drift-blocks-") as tmp:
        url = args.url
        if url is None:
            url_file = Path(tmp) / "url"
            server = subprocess.Popen([str(Path(sys.executable).with_name("moeperf")), "serve", args.profile,
                                       "--url-file", str(url_file), "--log-dir", tmp])
            while not url_file.exists():
                if server.poll() is not None:
                    sys.exit(f"moeperf serve {args.profile} exited {server.returncode}; its log is gone with {tmp}")
                time.sleep(1)
            url = url_file.read_text().strip()
        try:
            model = json.load(urllib.request.urlopen(f"{url}/v1/models"))["data"][0]["id"]
            gen = LoadGenerator(url, model)
            saved = []
            for i, (c, n) in enumerate(plan):
                reqs = random_token_requests(n + 2 * c, args.input_len, args.output_len,
                                             token_range=(16, args.vocab), seed=i)
                window = gen.run(reqs[2 * c:], ClosedLoop(c), warmup=reqs[:2 * c])
                outcomes = list(window.outcomes)
                print(f"window {i}: c={c}, {n} requests, {window.duration_s:.1f} s\n{describe(c, outcomes)}",
                      flush=True)
                saved.append({"concurrency": c, "duration_s": window.duration_s, "requests": [
                    {"start_s": o.start_s, "ttft_s": o.ttft_s, "latency_s": o.latency_s,
                     "output_tokens": o.output_tokens, "success": o.success} for o in outcomes]})
            args.out.write_text(json.dumps(saved))
            print(f"outcomes: {args.out}")
        finally:
            if server is not None:
                server.send_signal(2)
                server.wait(60)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
