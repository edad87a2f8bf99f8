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


def one(case: str) -> dict[str, object]:
    """In this process: time ``case`` (``model-op-mM-impl``) as the suite does, with the kernel and the clocks."""
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
    before = clocks()
    timed = gemm_measure.measure(impl, problem, device="cuda", cache_bytes=spec.cache_bytes or 0)
    after = clocks()
    built = gemm.build(impl, problem, device="cuda", copies=1)
    built.calls[0]()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        built.calls[0]()
        torch.cuda.synchronize()
    kernels = sorted({e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA})
    return {"case": case, "median_us": statistics.median(timed.samples), "min_us": min(timed.samples),
            "max_us": max(timed.samples), "samples": len(timed.samples), "copies": timed.copies,
            "kernels": kernels, "sm_mhz": [before[0], after[0]], "mem_mhz": [before[1], after[1]],
            "power_w": [round(before[2]), round(after[2])]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("cases", nargs="+", help="suite case ids, e.g. kimi-k2.5-dense_down-m2048-bf16")
    parser.add_argument("--processes", type=int, default=8)
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.cases[0])))
        return 0
    for case in args.cases:
        rows = []
        for i in range(args.processes):
            out = subprocess.run([sys.executable, __file__, "--one", case], capture_output=True, text=True,
                                 check=False)
            if out.returncode:
                print(f"{case} process {i}: exit {out.returncode}\n{out.stderr[-2000:]}", file=sys.stderr)
                continue
            row = json.loads(out.stdout.strip().splitlines()[-1])
            rows.append(row)
            print(f"{case} p{i}: median {row['median_us']:.2f} us (min {row['min_us']:.2f}, max {row['max_us']:.2f}), "
                  f"SM {row['sm_mhz']} MHz, mem {row['mem_mhz']} MHz, {row['power_w']} W, kernels {row['kernels']}",
                  flush=True)
        if not rows:
            continue
        medians = [r["median_us"] for r in rows]
        lo = min(medians)
        print(f"{case}: {len(rows)} processes, median of medians {statistics.median(medians):.2f} us, "
              f"max/min {max(medians) / lo:.3f}")
        groups: dict[str, list[float]] = {}
        for r in rows:
            groups.setdefault(" + ".join(r["kernels"]), []).append(r["median_us"])
        for kernel, values in groups.items():
            print(f"  {len(values)} process(es) {min(values):.2f}-{max(values):.2f} us: {kernel}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
