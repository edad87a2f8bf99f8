import time, statistics as st, json, sys
import torch
from pytest_moeperf.kernels import gemm, timing
from pytest_moeperf.kernels.devices import cpu_device
from pytest_moeperf.kernels.models import get_model
spec = cpu_device(); torch.set_num_threads(1)
p = gemm.problem_for(get_model("kimi-k2.5"), 8, sys.argv[1], int(sys.argv[2]))
copies = timing.rotation_copies(p.weight_bytes("bf16"), spec.cache_bytes, factor=2.0, max_total_bytes=1<<30)
b = gemm.build("bf16", p, device="cpu", copies=copies); fn = timing.cycle(b.calls)
for _ in range(copies): fn()
loops = max(1, int(0.01 / (timing.time_cpu(fn, iters=3, warmup=0, min_time_s=0.01, clock=time.thread_time_ns)[0]*1e-6)))
t0=time.monotonic(); out=[]
while time.monotonic()-t0 < float(sys.argv[3]):
    s=time.thread_time_ns(); w=time.perf_counter_ns()
    for _ in range(loops): fn()
    out.append((round(time.monotonic()-t0,2), round((time.thread_time_ns()-s)/loops/1000,1), round((time.perf_counter_ns()-w)/loops/1000,1)))
json.dump(out, open(sys.argv[4],"w"))
xs=[o[1] for o in out]; print(len(xs), "median", st.median(xs), "p10", sorted(xs)[len(xs)//10], "p90", sorted(xs)[9*len(xs)//10], "max", max(xs))
# 1-second bins
bins={}
for t,c,w in out: bins.setdefault(int(t),[]).append(c)
print(" ".join(f"{st.median(v):.0f}" for k,v in sorted(bins.items())))
