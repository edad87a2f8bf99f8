"""Run the perf suites of this checkout on this machine in one command, within a time budget, every output in
one folder, and stop every process it started (and nothing else) at the end.

Run it from the project checkout (or pass ``--root``). Steps, in the order they run (default: topology kernels
budget): ``topology`` (the probe), ``vllm-kernels`` (vLLM's Marlin, fused Marlin MoE and custom all-reduce cases,
first; skipped when vLLM does not import), ``kernels`` (GEMM and all-reduce suites), ``serving`` (serving and
spec-decode suites on the tiny profiles this machine can serve), ``attribution`` (``moeperf serve`` a profile with
its profiler on, then ``moeperf attribute``), ``budget`` (``moeperf budget`` tables from the kernel report and the
baselines). The environment passes through to every command (``PYTHONPATH``, ``CUDA_VISIBLE_DEVICES``, NCCL and
vLLM variables)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

from pytest_moeperf.batch import plan as planning
from pytest_moeperf.batch.facts import FactsError, ask
from pytest_moeperf.batch.runner import Batch
from pytest_moeperf.batch.units import Context, run_unit
from pytest_moeperf.processes import tree
from pytest_moeperf.processes.children import CACHE_ENV
from pytest_moeperf.settings.checks import at_least, describe, number_in

__all__ = ["main_batch"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="moeperf batch", description=__doc__.split("\n\n")[0],
                                epilog="Arguments after -- go to every pytest run (e.g. -- --moeperf-history off). "
                                "Relative paths are taken from the current directory.")
    p.add_argument("steps", nargs="*", metavar="STEP",
                   help=f"steps to run, any of: {', '.join(planning.STEPS)} (default: "
                   f"{' '.join(planning.DEFAULT_STEPS)}); they run in that order whatever order they are given in")
    mode = p.add_argument_group("what to measure and how to judge it")
    mode.add_argument("--update", action="store_true",
                      help="write the baselines (--moeperf-update) instead of judging against them")
    mode.add_argument("--aa", action=argparse.BooleanOptionalAction, default=None,
                      help="A/A check: after each --update run, the same selection again, judged against the "
                      "baselines it just wrote (expect no REGRESSED; default: on with --update)")
    mode.add_argument("--rounds", type=at_least(1), default=1, metavar="N",
                      help="--moeperf-rounds of each pytest run: N separate processes (default: %(default)s)")
    mode.add_argument("--quick", action="store_true", help="--moeperf-quick: fewer cases (smoke runs)")
    mode.add_argument("--kernels-k", metavar="EXPR", help="pytest -k of the kernels step (default: all cases)")
    mode.add_argument("--vllm-kernels-k", metavar="EXPR", default=planning.VLLM_KERNELS_K,
                      help="pytest -k of the vllm-kernels step; those cases leave the kernels step (default: "
                      "%(default)r)")
    mode.add_argument("--serving-k", metavar="EXPR", help="pytest -k of the serving step (default: gpu-tiny-tp2 "
                      "with 2+ GPUs, gpu-tiny-tp1 with one, cpu-tiny without)")
    mode.add_argument("--attribution", metavar="PROFILE[:EMULATION]", action="append",
                      help="a serve profile to attribute, optionally under an interconnect emulation (repeatable; "
                      "default: the nospec profile of --serving-k's default)")
    mode.add_argument("--attribution-batch", type=at_least(1), nargs="+", default=[1, 8, 32], metavar="N",
                      help="decode batches attributed per profile (default: 1 8 32)")
    mode.add_argument("--crosscheck", action="store_true", help="also compare our load generator with "
                      "vllm.benchmarks.serve on the first attribution server (concurrency 1 and 16)")
    mode.add_argument("--budget-model", default="kimi-k2.5", metavar="NAME",
                      help="model of the budget tables (default: %(default)s)")
    mode.add_argument("--budget-tp", type=at_least(1), default=8, metavar="N", help="TP of the budget tables "
                      "(default: %(default)s)")
    mode.add_argument("--budget-batch", type=at_least(1), default=1, metavar="N", help="decode batch of the budget "
                      "tables (default: %(default)s)")
    mode.add_argument("--budget-topology", metavar="TOPOLOGY", help="also a budget table of the kernel report scaled "
                      "to this target (topology file or bundled name, e.g. 8x-rtx-pro-6000-pcie)")
    mode.add_argument("--budget-allreduce-us", type=number_in(0.0), metavar="US",
                      help="all-reduce latency per call for the --budget-topology table")
    where = p.add_argument_group("where and how long")
    where.add_argument("--out", type=Path, metavar="DIR", help="folder for the logs, reports and summary; must be new "
                       "or empty (default: moeperf-batch/<UTC time> under the current directory)")
    where.add_argument("--root", type=Path, default=Path("."), metavar="DIR",
                       help="the project checkout whose suites run; every command runs there (default: .)")
    where.add_argument("--baselines", type=Path, metavar="DIR",
                       help="baselines directory (default: baselines under --root)")
    where.add_argument("--python", default=sys.executable, metavar="PATH",
                       help="interpreter of every step: it must import pytest_moeperf (default: the one running "
                       "moeperf)")
    where.add_argument("--deadline", type=number_in(0.0, strict=True), metavar="SECONDS",
                       help="the whole batch's time budget: each pytest run or attribution gets an equal share of "
                       "the time left as its --moeperf-deadline less its grace, and is interrupted at the end of "
                       "its share (default: none)")
    where.add_argument("--grace", type=number_in(0.0), metavar="SECONDS",
                       help="how long a run may go past its --moeperf-deadline to end the test in flight and write "
                       "its reports (default: 40 kernels, 180 serving, 60 attribution)")
    where.add_argument("--model-cache", type=Path, metavar="DIR",
                       help="where attribution's generated models go (default: .moeperf/models under --root); the "
                            "serving step's servers keep their generated models and vLLM's compile caches beside "
                            "it, in its parent folder, so a later batch starts warm (unless MOEPERF_SERVE_CACHE is "
                            "set)")
    where.add_argument("--profiles", type=Path, action="append", metavar="DIR",
                       help="serve profile directory for attribution (repeatable; default: moeperf serve's)")
    return p


def _options(args: argparse.Namespace, parser: argparse.ArgumentParser, extra: Sequence[str]) -> planning.Options:
    unknown = [s for s in args.steps if s not in planning.STEPS]
    if unknown:
        parser.error(f"unknown step {unknown[0]!r}; steps: {', '.join(planning.STEPS)}")
    if args.aa and not args.update:
        parser.error("--aa needs --update (without it every run is already judged against the baselines)")
    if args.budget_allreduce_us is not None and not args.budget_topology:
        parser.error("--budget-allreduce-us needs --budget-topology")
    for entry in args.attribution or ():
        if not entry.partition(":")[0]:
            parser.error(f"--attribution {entry!r}: expected PROFILE or PROFILE:EMULATION")
    return planning.Options(
        steps=tuple(args.steps) or planning.DEFAULT_STEPS, update=args.update,
        aa=args.update if args.aa is None else args.aa, rounds=args.rounds, quick=args.quick,
        kernels_k=args.kernels_k, vllm_kernels_k=args.vllm_kernels_k, serving_k=args.serving_k,
        attribution=tuple(args.attribution or ()), attribution_batches=tuple(args.attribution_batch),
        crosscheck=args.crosscheck, grace_s=args.grace, pytest_args=tuple(extra))


def _out_dir(args: argparse.Namespace, parser: argparse.ArgumentParser) -> Path:
    out: Path = args.out or Path("moeperf-batch") / datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        parser.error(f"--out {out} is {'a file' if not out.is_dir() else 'not empty'}: name a new or empty folder")
    return out.resolve()


def _missing_suite(steps: Sequence[str], root: Path) -> str | None:
    for path in (p for step in steps for p in planning.SUITES.get(step, ())):
        if not (root / path).is_dir():
            return f"no {path} under {root}: run from the project checkout or pass --root DIR"
    return None


def main_batch(argv: Sequence[str] | None = None) -> int:
    """0: every step ran and passed (or was skipped, saying why); 1: a step failed or was cut (at its time limit, or
    its deadline skipped tests); 2: bad arguments or an interpreter that cannot run the steps; 130: interrupted."""
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    parser = _parser()
    args = parser.parse_args(argv)
    options = _options(args, parser, extra)
    root = args.root.resolve()
    if not root.is_dir():
        parser.error(f"--root {args.root} is not a directory")
    problem = _missing_suite(options.steps, root)
    if problem is not None:
        parser.error(problem)
    out = _out_dir(args, parser)
    env = {**os.environ, "PYTHONUNBUFFERED": os.environ.get("PYTHONUNBUFFERED", "1")}
    # the commands run in --root: a relative interpreter path is made absolute (not resolved: a venv's python is
    # a symlink whose target would leave the venv)
    python = os.path.abspath(args.python) if os.sep in args.python else args.python
    try:
        facts = ask(python, env, str(root), check_vllm=planning.VLLM_KERNELS in options.steps)
    except FactsError as exc:
        print(f"moeperf batch: --python: {describe(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    units, notes = planning.plan(options, gpu_count=facts.gpu_count, vllm=facts.vllm is not None)
    out.mkdir(parents=True, exist_ok=True)
    model_cache = (args.model_cache or root / ".moeperf" / "models").resolve()
    # the serving step's pytest runs without a pytest cache (-p no:cacheprovider): its servers' generated models and
    # compile caches go to a folder that outlives the batch, so the next batch's first start is a warm one
    env.setdefault(CACHE_ENV, str(model_cache.parent))
    batch = Batch(out, root=root, env=env, deadline_s=args.deadline)
    budget_target = () if not args.budget_topology else (
        "--topology", args.budget_topology,
        *(("--allreduce-us", f"{args.budget_allreduce_us:g}") if args.budget_allreduce_us is not None else ()))
    ctx = Context(python=python, facts=facts, baselines=(args.baselines or root / "baselines").resolve(),
                  model_cache=model_cache,
                  profiles=tuple(p.resolve() for p in args.profiles or ()),
                  budget_args=("--model", args.budget_model, "--tp", str(args.budget_tp), "--batch",
                               str(args.budget_batch)), budget_target=budget_target)
    tree.become_subreaper()
    previous = batch.install_signal_handlers()
    try:
        command = " ".join(["moeperf batch", *argv, *(["--", *extra] if extra else [])])
        batch.note(f"{command} (started {batch.started_utc}, pid {os.getpid()}; outputs in {out})")
        for line in [*facts.describe(), *notes]:
            batch.note(line)
        for i, unit in enumerate(units):
            if batch.interrupted:
                batch.note(f"{unit.name}: not started (interrupted)")
                continue
            run_unit(batch, ctx, unit, units[i:])
        if options.update and any(isinstance(u, planning.PytestRun) and u.update for u in units):
            batch.note(_keep_baselines(ctx.baselines, facts.fingerprint, out))
            if not _in_git(ctx.baselines):  # the diff compares with what git holds: nothing to compare with
                batch.note(f"moeperf baselines diff: skipped: {ctx.baselines} is not inside a git checkout "
                           "(nothing committed to compare the update with)")
            else:
                diff = out / "baselines-diff.md"
                done = batch.run([python, "-m", "pytest_moeperf.cli", "baselines", "diff", "--baselines",
                                  str(ctx.baselines)], diff, until=None, grace_s=10.0)
                batch.note(f"moeperf baselines diff: {done.describe()} ({batch.output(diff)})")
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for proc in tree.stop_descendants():
            batch.note(f"stopped {proc.pid} {proc.command}")
    code = batch.exit_code()
    (out / "batch.json").write_text(json.dumps({
        "started": batch.started_utc, "seconds": round(batch.elapsed(), 1), "exit": code, "root": str(root),
        "python": python, "fingerprint": facts.fingerprint, "steps": [r.to_json() for r in batch.results]},
        indent=2, sort_keys=True) + "\n")
    batch.note(f"done: exit {code}; " + ", ".join(f"{r.name} {r.status}" for r in batch.results))
    return code


def _keep_baselines(baselines: Path, fingerprint: str, out: Path) -> str:
    """Copy this fingerprint's baselines, as the update left them, into the batch's outputs: on a lent or
    self-hosted runner the outputs folder is what comes back, and a record must not stay behind on the machine."""
    source, kept = baselines / fingerprint, out / "baselines" / fingerprint
    if not source.is_dir():
        return f"baselines: nothing written under {source} to keep"
    shutil.copytree(source, kept, dirs_exist_ok=True)
    return f"baselines: {source} copied to {kept} (commit them from there if this machine is not the checkout's)"


def _in_git(path: Path) -> bool:
    """Whether ``path`` (or, before an update creates it, its nearest existing parent) is inside a git checkout."""
    where = next((p for p in (path, *path.parents) if p.is_dir()), Path("/"))
    done = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=where, capture_output=True, text=True)
    return done.returncode == 0
