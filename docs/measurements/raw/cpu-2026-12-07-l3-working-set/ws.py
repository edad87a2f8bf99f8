"""Time CPU GEMM cases at given working sets (weight copies), as gemm_measure does, in one process."""
import json, statistics as st, sys, time
import torch
from pytest_moeperf.kernels import gemm, timing
from pytest_moeperf.kernels.gemm_measure import build, check, CPU_CLOCK
from pytest_moeperf.kernels.models import get_model
torch.set_num_threads(1)
model = get_model("kimi-k2.5")
cases = [c.split(":") for c in sys.argv[1].split(",")]      # op:m:impl
factors = [float(f) for f in sys.argv[2].split(",")]       # working set / 300 MiB
span = float(sys.argv[3]) if len(sys.argv) > 3 else 2.0
L3 = 300 << 20
out = {}
for op, m, impl in cases:
    p = gemm.problem_for(model, 8, op, int(m))
    b = p.weight_bytes(impl)
    for f in factors:
        copies = max(1, round(f * L3 / b))
        built = build(impl, p, device="cpu", copies=copies)
        check(built)
        fn = timing.cycle(built.calls)
        s = timing.time_cpu_spread(fn, samples=7, best_of=3, span_s=span, warmup=copies, min_time_s=0.01, clock=CPU_CLOCK)
        out[f"{op}-m{m}-{impl} x{f:g} ({copies} copies)"] = round(st.median(s), 1)
        del built, fn
print(time.strftime("%H:%M:%S"), sys.argv[4] if len(sys.argv) > 4 else "", json.dumps(out), flush=True)
