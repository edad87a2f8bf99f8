"""What a batch runs, in order: the steps a user picked, turned into units (pure: no process is started here).

Steps: ``topology`` (the probe), ``vllm-kernels`` (vLLM's kernels alone, first, so a deadline cannot cut them),
``kernels`` (the GEMM and all-reduce suites), ``serving`` (the serving and spec-decode suites), ``attribution``
(``moeperf serve`` + ``moeperf attribute`` per profile) and ``budget`` (``moeperf budget`` tables from the kernel
runs). Under ``--update`` each pytest step writes baselines, and with the A/A check on it is followed by the same
selection judged against what it just wrote (expect no REGRESSED)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DEFAULT_STEPS", "STEPS", "SUITES", "VLLM_KERNELS_K", "Attribution", "Budget", "Options", "PytestRun",
           "Topology", "Unit", "default_attribution", "default_serving_k", "plan"]

TOPOLOGY, VLLM_KERNELS, KERNELS, SERVING, ATTRIBUTION, BUDGET = (
    "topology", "vllm-kernels", "kernels", "serving", "attribution", "budget")
#: every step, in the order a batch runs them
STEPS = (TOPOLOGY, VLLM_KERNELS, KERNELS, SERVING, ATTRIBUTION, BUDGET)
DEFAULT_STEPS = (TOPOLOGY, KERNELS, BUDGET)
KERNEL_SUITES = ("suites/allreduce", "suites/gemm")
SERVING_SUITES = ("suites/serving", "suites/specdecode")
#: the suite folders (under the checkout) each pytest step runs
SUITES = {VLLM_KERNELS: KERNEL_SUITES, KERNELS: KERNEL_SUITES, SERVING: SERVING_SUITES}
#: vLLM's own kernels among the kernel cases: Marlin, fused Marlin MoE, custom all-reduce
VLLM_KERNELS_K = "marlin or vllm_custom"
#: seconds a step may run past its --moeperf-deadline: the test in flight ends (a serving test may be starting a
#: server, 70-140 s on an H200 host) and the session writes its reports and baselines
GRACE_S = {VLLM_KERNELS: 40.0, KERNELS: 40.0, SERVING: 180.0, ATTRIBUTION: 60.0}


@dataclass(frozen=True)
class Options:
    """The user's choices (``moeperf batch --help`` describes each)."""

    steps: tuple[str, ...] = DEFAULT_STEPS
    update: bool = False
    aa: bool = False
    rounds: int = 1
    quick: bool = False
    kernels_k: str | None = None
    vllm_kernels_k: str = VLLM_KERNELS_K
    serving_k: str | None = None
    attribution: tuple[str, ...] = ()
    attribution_batches: tuple[int, ...] = (1, 8, 32)
    crosscheck: bool = False
    grace_s: float | None = None
    pytest_args: tuple[str, ...] = ()


@dataclass(frozen=True)
class Topology:
    name: str = TOPOLOGY


@dataclass(frozen=True)
class PytestRun:
    """One pytest session (``rounds`` processes under ``--moeperf-rounds``), its log and report named ``name``."""

    name: str
    step: str
    paths: tuple[str, ...]
    keyword: str | None
    update: bool
    rounds: int
    grace_s: float
    args: tuple[str, ...]


@dataclass(frozen=True)
class Attribution:
    """``moeperf serve PROFILE`` (under ``emulation``), the cross-check on it when asked, ``moeperf attribute``."""

    name: str
    profile: str
    emulation: str | None
    batches: tuple[int, ...]
    crosscheck: bool
    grace_s: float


@dataclass(frozen=True)
class Budget:
    """``moeperf budget`` from a kernel run's report (``None``: no kernel step ran) and from the baselines."""

    report: str | None
    name: str = BUDGET


Unit = Topology | PytestRun | Attribution | Budget


def default_serving_k(gpu_count: int) -> str:
    """The tiny profiles this machine can serve: TP=2 on 2+ GPUs, TP=1 on one, the CPU profiles without."""
    return "gpu-tiny-tp2" if gpu_count >= 2 else "gpu-tiny-tp1" if gpu_count == 1 else "cpu-tiny"


def default_attribution(gpu_count: int) -> str:
    return f"{default_serving_k(gpu_count)}-nospec"


def _and(*exprs: str | None) -> str | None:
    parts = [e for e in exprs if e]
    return None if not parts else parts[0] if len(parts) == 1 else " and ".join(f"({e})" for e in parts)


def _grace(options: Options, step: str) -> float:
    return GRACE_S[step] if options.grace_s is None else options.grace_s


def _runs(options: Options, step: str, paths: tuple[str, ...], keyword: str | None) -> list[PytestRun]:
    """The step's run, then (under --update with the A/A check on) the same selection judged, one round."""
    args = (*(("--moeperf-quick",) if options.quick else ()), *options.pytest_args)
    first = PytestRun(name=step, step=step, paths=paths, keyword=keyword, update=options.update,
                      rounds=options.rounds, grace_s=_grace(options, step), args=args)
    if not (options.update and options.aa):
        return [first]
    return [first, PytestRun(name=f"{step}-aa", step=step, paths=paths, keyword=keyword, update=False, rounds=1,
                             grace_s=first.grace_s, args=args)]


def plan(options: Options, *, gpu_count: int, vllm: bool) -> tuple[list[Unit], list[str]]:
    """The units to run, in order, and a note for each selected step left out (``vllm-kernels`` without vLLM)."""
    units: list[Unit] = []
    notes: list[str] = []
    chosen = set(options.steps)
    vllm_first = VLLM_KERNELS in chosen and vllm
    if VLLM_KERNELS in chosen and not vllm:
        notes.append(f"{VLLM_KERNELS}: vLLM does not import with this interpreter: its kernel cases skip")
    for step in STEPS:
        if step not in chosen:
            continue
        if step == TOPOLOGY:
            units.append(Topology())
        elif step == VLLM_KERNELS and vllm_first:
            units += _runs(options, step, SUITES[step], _and(options.vllm_kernels_k, options.kernels_k))
        elif step == KERNELS:
            # vLLM's cases ran in their own step: not measured twice (an update would store two runs of one sitting)
            skip_vllm = f"not ({options.vllm_kernels_k})" if vllm_first else None
            units += _runs(options, step, SUITES[step], _and(options.kernels_k, skip_vllm))
        elif step == SERVING:
            units += _runs(options, step, SUITES[step], options.serving_k or default_serving_k(gpu_count))
        elif step == ATTRIBUTION:
            for i, entry in enumerate(options.attribution or (default_attribution(gpu_count),)):
                profile, _, emulation = entry.partition(":")
                units.append(Attribution(name=f"attribution-{profile}-{emulation or 'native'}", profile=profile,
                                         emulation=emulation or None, batches=options.attribution_batches,
                                         crosscheck=options.crosscheck and i == 0,
                                         grace_s=_grace(options, step)))
        elif step == BUDGET:
            runs = [u for u in units if isinstance(u, PytestRun) and u.step in (KERNELS, VLLM_KERNELS)]
            ranked = [u for u in runs if u.step == KERNELS] or runs  # the full kernel run, its A/A run preferred
            units.append(Budget(report=ranked[-1].name if ranked else None))
    return units, notes
