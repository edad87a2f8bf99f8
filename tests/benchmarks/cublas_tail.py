"""Why do some bf16 cuBLAS GEMM cases move between processes on one box? (A benchmark, not a test: run by hand on a
GPU box; numbers go to docs/measurements/.)

Runs each named suite case in ``--processes`` fresh processes, one after the other. Each process times the case
exactly as ``suites/gemm`` does (`pytest_moeperf.kernels.gemm_measure.measure`) and records what could explain a
move between processes: the kernel cuBLAS picked (``torch.profiler``, one call of copy 0), the SM and memory clocks
and the power draw read through NVML around the timing, and the address alignment of the weights. The table shows
each process's median, the kernel and the clocks, then per case whether the medians group by kernel.

    python tests/benchmarks/cublas_tail.py kimi-k2.5-dense_down-m2048-bf16 kimi-k2.5-dense_gate_up-m256-bf16
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys


def one(case: str, warmups_ms: list[float], gap_s: float, rotate: int) -> list[dict[str, object]]:
    """In this process: time ``case`` (``model-op-mM-impl``) as the suite does, once per untimed warm-up length of
    ``warmups_ms`` (in an order rotated by ``rotate``, each after ``gap_s`` idle, as between suite cases), with the
    kernel and the clocks."""
    import time

    import pynvml
    import torch

    from pytest_moeperf.kernels import gemm, gemm_measure
    from pytest_moeperf.kernels.devices import cuda_device
    from pytest_moeperf.kernels.models import get_model

    family, version, rest = case.split("-", 2)  # the suite's ids: f"{model}-{op}-m{m}-{impl}", models "name-version"
    op, m_part, impl = rest.rsplit("-", 2)
    problem = gemm.problem_for(get_model(f"{family}-{version}"), 8, op, int(m_part[1:]))
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())

    def clocks() -> tuple[int, int, float]:
        return (pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM),
                pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_MEM),
                pynvml.nvmlDeviceGetPowerUsage(handle) / 1000.0)

    spec = cuda_device(torch.cuda.current_device())
    rows = []
    k = rotate % len(warmups_ms)
    for warmup_ms in warmups_ms[k:] + warmups_ms[:k]:
        time.sleep(gap_s)
        before = clocks()
        timed = gemm_measure.measure(impl, problem, device="cuda", cache_bytes=spec.cache_bytes or 0,
                                     warmup_us=warmup_ms * 1000.0)
        after = clocks()
        rows.append({"case": case, "warmup_ms": warmup_ms, "median_us": statistics.median(timed.samples),
                     "min_us": min(timed.samples), "max_us": max(timed.samples), "samples": len(timed.samples),
                     "copies": timed.copies, "sm_mhz": [before[0], after[0]], "mem_mhz": [before[1], after[1]],
                     "power_w": [round(before[2]), round(after[2])]})
    built = gemm.build(impl, problem, device="cuda", copies=1)
    built.calls[0]()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        built.calls[0]()
        torch.cuda.synchronize()
    kernels = sorted({e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA})
    return [dict(row, kernels=kernels) for row in rows]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("cases", nargs="+", help="suite case ids, e.g. kimi-k2.5-dense_down-m2048-bf16")
    parser.add_argument("--processes", type=int, default=8)
    parser.add_argument("--warmup-ms", default="0", help="comma-separated untimed warm-up lengths, each timed once "
                        "per process (0: the suite's minimum of 3 replays)")
    parser.add_argument("--gap-s", type=float, default=0.3, help="idle before each timing, as between suite cases")
    parser.add_argument("--one", type=int, default=-1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    warmups = [float(w) for w in args.warmup_ms.split(",")]
    if args.one >= 0:
        print(json.dumps(one(args.cases[0], warmups, args.gap_s, args.one)))
        return 0
    for case in args.cases:
        rows = []
        for i in range(args.processes):
            out = subprocess.run([sys.executable, __file__, "--one", str(i), "--warmup-ms", args.warmup_ms,
                                  "--gap-s", str(args.gap_s), case], capture_output=True, text=True, check=False)
            if out.returncode:
                print(f"{case} process {i}: exit {out.returncode}\n{out.stderr[-2000:]}", file=sys.stderr)
                continue
            for row in json.loads(out.stdout.strip().splitlines()[-1]):
                rows.append(row)
                print(f"{case} p{i} warm-up {row['warmup_ms']:g} ms: median {row['median_us']:.2f} us "
                      f"(min {row['min_us']:.2f}, max {row['max_us']:.2f}), SM {row['sm_mhz']} MHz, "
                      f"mem {row['mem_mhz']} MHz, {row['power_w']} W, kernels {row['kernels']}", flush=True)
        if not rows:
            continue
        for warmup in warmups:
            medians = [r["median_us"] for r in rows if r["warmup_ms"] == warmup]
            minima = [r["min_us"] for r in rows if r["warmup_ms"] == warmup]
            print(f"{case} warm-up {warmup:g} ms: {len(medians)} processes, median of medians "
                  f"{statistics.median(medians):.2f} us, max/min of medians {max(medians) / min(medians):.3f}, "
                  f"of minima {max(minima) / min(minima):.3f}")
        groups: dict[str, list[float]] = {}
        for r in rows:
            groups.setdefault(" + ".join(r["kernels"]), []).append(r["median_us"])
        for kernel, values in groups.items():
            print(f"  {len(values)} process(es) {min(values):.2f}-{max(values):.2f} us: {kernel}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
