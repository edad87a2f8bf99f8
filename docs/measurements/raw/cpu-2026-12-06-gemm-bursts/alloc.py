import sys, time, statistics as st, json, os
import torch
from pytest_moeperf.kernels import gemm, gemm_measure
from pytest_moeperf.kernels.devices import cpu_device
from pytest_moeperf.kernels.models import get_model
from pytest_moeperf.machine.canary import cpu_workloads
spec = cpu_device()
cases = [("o_proj",1,"bf16"),("q_b_proj",1,"bf16"),("gate_up",8,"bf16"),("shared_gate_up",8,"bf16")]
allocs = int(sys.argv[1]) if len(sys.argv)>1 else 4
wl = {w.name: w for w in cpu_workloads(spec.cache_bytes)}
out = {}
for a in range(allocs):
    for op,m,impl in cases:
        p = gemm.problem_for(get_model("kimi-k2.5"), 8, op, m)
        t = gemm_measure.measure(impl, p, device="cpu", cache_bytes=spec.cache_bytes or 0)
        out.setdefault(f"{op}-m{m}", []).append(round(st.median(t.samples),1))
    out.setdefault("stream", []).append(round(st.median(wl["cpu_stream"].measure()),1))
    out.setdefault("compute", []).append(round(st.median(wl["cpu_compute"].measure()),1))
print(os.environ.get("THP_MEM_ALLOC_ENABLE","-"), time.strftime("%H:%M:%S"), json.dumps(out))
