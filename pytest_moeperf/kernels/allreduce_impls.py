"""How each all-reduce backend is set up inside a rank and called: process-group ``gloo`` / ``nccl``, torch
symmetric memory (one-shot / two-shot, P2P loads, never NVLink multicast) and vLLM's custom all-reduce.

:func:`build_impl` returns an :class:`Impl` (the input buffer the caller fills and a ``run()`` that all-reduces
it), or raises :class:`Unsupported` with the reason the backend cannot run here (the suite skips with it).
Objects that must be created once per rank process (symmetric buffers, vLLM's IPC buffers) are cached.
"""

from __future__ import annotations

import inspect
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pytest_moeperf.kernels.rank_worker import Rank

if TYPE_CHECKING:
    import torch

    from pytest_moeperf.kernels.collectives import AllReduceTask

__all__ = ["Impl", "Unsupported", "build_impl"]


class Unsupported(Exception):
    """The backend cannot run on this machine; the suite skips with this reason."""


@dataclass
class Impl:
    """A ready backend: ``source`` is filled by the caller, ``run()`` all-reduces it and returns the result."""

    source: torch.Tensor
    run: Callable[[], torch.Tensor]
    info: dict[str, str] = field(default_factory=dict)
    after_capture: Callable[[], object] | None = None  # between CUDA-graph capture and the first replay


_CACHE: dict[str, Any] = {}  # per rank process: objects that must be created once (groups, IPC buffers)


def build_impl(rank: Rank, task: AllReduceTask) -> Impl:
    import torch
    import torch.distributed as dist

    dtype = torch.bfloat16  # the model's activations; gloo sums bf16 too
    numel = task.nbytes // torch.tensor([], dtype=dtype).element_size()
    device = rank.device
    if task.backend in ("gloo", "nccl"):
        buf = torch.zeros(numel, dtype=dtype, device=device)

        def run_pg() -> torch.Tensor:
            dist.all_reduce(buf)
            return buf

        info: dict[str, str] = {}
        if task.backend == "nccl":
            version = torch.cuda.nccl.version()  # type: ignore[no-untyped-call, unused-ignore]
            info["nccl"] = ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
        return Impl(buf, run_pg, info)
    if task.backend.startswith("symm_mem_"):
        return _build_symm_mem(rank, task, numel, dtype)
    if task.backend == "vllm_custom":
        return _build_vllm(rank, task, numel, dtype)
    raise ValueError(f"unknown all-reduce backend {task.backend!r}")


def _build_symm_mem(rank: Rank, task: AllReduceTask, numel: int, dtype: torch.dtype) -> Impl:
    import torch
    import torch.distributed as dist

    try:
        import torch.distributed._symmetric_memory as symm_mem
    except ImportError as exc:
        raise Unsupported(f"torch.distributed._symmetric_memory is not importable: {exc}") from None
    op_name = "one_shot_all_reduce" if task.backend == "symm_mem_one_shot" else "two_shot_all_reduce_"
    if not hasattr(torch.ops.symm_mem, op_name):
        raise Unsupported(f"torch {torch.__version__} has no torch.ops.symm_mem.{op_name}")
    group = dist.group.WORLD
    assert group is not None
    group_name = group.group_name
    key = f"symm_mem:{task.capacity_bytes}"
    if key not in _CACHE:
        for old in [k for k in _CACHE if k.startswith("symm_mem:")]:
            del _CACHE[old]  # a buffer of another capacity
        capacity = task.capacity_bytes // torch.tensor([], dtype=dtype).element_size()
        try:
            enable = getattr(symm_mem, "enable_symm_mem_for_group", None)
            if enable is not None:  # deprecated (a no-op) in recent torch, required in older ones
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    enable(group_name)
            buffer = symm_mem.empty(capacity, dtype=dtype, device=rank.device)
            handle = symm_mem.rendezvous(buffer, group_name)
        except Exception as exc:  # noqa: BLE001 - "where it runs": a setup failure is the reason to skip
            raise Unsupported(f"symmetric memory setup failed: {type(exc).__name__}: {exc}") from None
        _CACHE[key] = (buffer, handle)
    buffer, _handle = _CACHE[key]
    view = buffer[:numel]
    op = getattr(torch.ops.symm_mem, op_name)

    def run_symm() -> torch.Tensor:
        out = op(view, "sum", group_name)
        return view if out is None else out  # type: ignore[no-any-return, unused-ignore]

    info: dict[str, str] = {}
    try:
        info["symm_mem_backend"] = str(symm_mem.get_backend(rank.device))
    except Exception:  # noqa: BLE001 - only a label for the report; older torch has no get_backend
        pass
    return Impl(view, run_symm, info)


#: vLLM's CustomAllreduce API this module calls (vLLM 0.26: ``CustomAllreduce(group, device, max_size=...)``,
#: ``all_reduce(inp, *, out=None, registered=False)``, ``disabled``).
VLLM_INIT_PARAMS = ("group", "device", "max_size")
VLLM_ALL_REDUCE_PARAMS = ("inp", "out", "registered")


def _vllm_api_mismatch(cls: Any) -> str | None:
    init = inspect.signature(cls.__init__).parameters
    call = inspect.signature(cls.all_reduce).parameters
    missing = [f"__init__({p})" for p in VLLM_INIT_PARAMS if p not in init]
    missing += [f"all_reduce({p})" for p in VLLM_ALL_REDUCE_PARAMS if p not in call]
    return ", ".join(missing) or None


def _build_vllm(rank: Rank, task: AllReduceTask, numel: int, dtype: torch.dtype) -> Impl:
    """vLLM's custom all-reduce with an unregistered input: each call copies the input into vLLM's IPC buffer
    (what ``all_reduce(..., registered=False)`` does), then runs the one-shot / two-shot kernel. Unless told
    otherwise, vLLM trusts the driver's P2P report (``VLLM_SKIP_P2P_CHECK=1``, its default in recent releases)
    instead of spawning its P2P probe processes."""
    import torch
    import torch.distributed as dist

    os.environ.setdefault("VLLM_SKIP_P2P_CHECK", "1")
    try:
        from vllm.distributed.device_communicators.custom_all_reduce import CustomAllreduce
    except Exception as exc:  # noqa: BLE001 - vLLM fails to import in many ways (ImportError, RuntimeError, ...)
        raise Unsupported(f"vLLM's custom all-reduce is not importable: {type(exc).__name__}: {exc}") from None
    mismatch = _vllm_api_mismatch(CustomAllreduce)
    if mismatch:
        raise Unsupported(f"vLLM's CustomAllreduce API is not the one this suite calls: no {mismatch}")
    key = f"vllm:{task.capacity_bytes}"
    if key not in _CACHE:
        cpu_group = _CACHE.get("gloo_group") or dist.new_group(backend="gloo")
        _CACHE["gloo_group"] = cpu_group
        try:  # vLLM takes inputs strictly smaller than max_size: keep 1 MiB of headroom
            _CACHE[key] = CustomAllreduce(group=cpu_group, device=rank.device,
                                          max_size=task.capacity_bytes + (1 << 20))
        except Exception as exc:  # noqa: BLE001 - "when it runs": a setup failure is the reason to skip
            raise Unsupported(f"vLLM's CustomAllreduce could not be set up: {type(exc).__name__}: {exc}") from None
    comm = _CACHE[key]
    if comm.disabled:
        raise Unsupported("vLLM disabled its custom all-reduce on this machine (see its log: world size, "
                          "NVLink / P2P checks)")
    source = torch.zeros(numel, dtype=dtype, device=rank.device)
    out = torch.empty_like(source)
    should = getattr(comm, "should_custom_ar", None)
    if should is not None and not should(source):
        raise Unsupported(f"vLLM would not use its custom all-reduce for {task.nbytes} B (should_custom_ar is "
                          "False: size, alignment or world size)")

    def run_vllm() -> torch.Tensor:
        comm.all_reduce(source, out=out, registered=False)
        return out

    import vllm

    # Captured calls point at buffers vLLM IPC-registers only after capture (its ``capture()`` context does it on
    # exit): replaying before that reads unmapped memory (seen on 2x H200: an illegal memory access).
    return Impl(source, run_vllm, {"vllm": str(vllm.__version__)}, after_capture=comm.register_graph_buffers)
