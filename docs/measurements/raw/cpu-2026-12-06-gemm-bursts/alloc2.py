import sys, time, statistics as st, json, os
import torch
from pytest_moeperf.kernels import gemm, timing, gemm_measure
from pytest_moeperf.kernels.devices import cpu_device
from pytest_moeperf.kernels.models import get_model
spec = cpu_device(); torch.set_num_threads(1)
def built(op,m):
    p = gemm.problem_for(get_model("kimi-k2.5"), 8, op, m)
    copies = timing.rotation_copies(p.weight_bytes("bf16"), spec.cache_bytes, factor=2.0, max_total_bytes=1<<30)
    b = gemm.build("bf16", p, device="cpu", copies=copies); return b
def t(b):
    fn = timing.cycle(b.calls)
    raw = timing.time_cpu(fn, iters=21, warmup=len(b.calls), min_time_s=0.01, clock=time.thread_time_ns)
    return round(st.median([min(raw[i:i+3]) for i in range(0,21,3)]),1)
res={}
for op,m in [("o_proj",1),("q_b_proj",1),("shared_gate_up",8)]:
    fixed = built(op,m)
    same=[]; fresh=[]
    for i in range(6):
        same.append(t(fixed))
        b=built(op,m); fresh.append(t(b)); del b
    sd=lambda xs: round(100*st.pstdev(xs)/st.mean(xs),1)
    res[f"{op}-m{m}"]={"same":same,"fresh":fresh,"cv_same%":sd(same),"cv_fresh%":sd(fresh)}
print(time.strftime("%H:%M:%S"), json.dumps(res))
