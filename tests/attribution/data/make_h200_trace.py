"""How ``h200x2-graph-and-eager_rank0.pt.trace.json.gz`` was made (2×H200 NV18, torch 2.11.0+cu130, NCCL 2.28.9,
2026-11-30): ``python make_h200_trace.py OUTDIR``; rank 0's trace is kept. A decode-like step, bf16 GEMM
[8, 7168] × [7168, 7168], NCCL all-reduce of the result, SDPA over a 512-token cache, wrapped in vLLM's step
annotation: 8 steps replayed from one CUDA graph (batch label 8), then 6 eager steps (batch label 4)."""

import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile, record_function, tensorboard_trace_handler


def worker(rank: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29533")
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=2, device_id=torch.device("cuda", rank))
    bf = torch.bfloat16
    x = torch.randn(8, 7168, device="cuda", dtype=bf)
    w = torch.randn(7168, 7168, device="cuda", dtype=bf)
    q = torch.randn(8, 16, 1, 128, device="cuda", dtype=bf)
    k = torch.randn(8, 16, 512, 128, device="cuda", dtype=bf)

    def step() -> torch.Tensor:
        h = x @ w
        dist.all_reduce(h)
        a = F.scaled_dot_product_attention(q, k, k)
        return F.silu(h) + a.sum()

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    torch.cuda.synchronize()
    handler = tensorboard_trace_handler(out, worker_name=f"dp0_pp0_tp{rank}_rank{rank}", use_gzip=True)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], on_trace_ready=handler):
        for _ in range(8):
            with record_function("execute_context_0(0)_generation_8(8)"):
                graph.replay()
        torch.cuda.synchronize()
        for _ in range(6):
            with record_function("execute_context_0(0)_generation_4(4)"):
                step()
        torch.cuda.synchronize()
    dist.barrier()  # the run ended here with both traces written (the process group teardown then hung)
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, args=(sys.argv[1],), nprocs=2)
