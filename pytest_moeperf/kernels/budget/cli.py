"""``moeperf budget``: print a decode-step budget from a run's report, stored baselines, or given numbers."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pytest_moeperf.kernels.budget.calc import ROUTED_IMPL_CHOICES, ROUTED_PREFERENCE, AllReducePoint, Piece, assemble
from pytest_moeperf.kernels.budget.inputs import inputs_from_baselines, inputs_from_report
from pytest_moeperf.kernels.budget.render import budget_lines
from pytest_moeperf.kernels.devices import DeviceSpec, lookup
from pytest_moeperf.kernels.models import ModelSpec, get_model, model_names
from pytest_moeperf.settings.checks import at_least, describe, file_problem, number_in
from pytest_moeperf.store.baselines import BaselineError

__all__ = ["main_budget"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="moeperf budget",
        description="Decode-step time budget (GEMMs + all-reduces per rank) from measured numbers.",
    )
    p.add_argument("--model", default="kimi-k2.5",
                   help=f"registered model ({', '.join(model_names())}) or a config.json path (default: kimi-k2.5)")
    p.add_argument("--tp", type=at_least(1), default=None, help="tensor-parallel degree (default: the topology's GPU "
                   "count, else 8)")
    p.add_argument("--batch", type=at_least(1), default=1, help="decode batch (tokens per step; default: 1)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--from-report", metavar="PATH", type=Path, help="a run's JSON report (--moeperf-report)")
    src.add_argument("--baselines", metavar="DIR", type=Path, help="baselines root (with --fingerprint)")
    p.add_argument("--fingerprint", metavar="SLUG", help="fingerprint slug under --baselines")
    p.add_argument("--allreduce-us", metavar="US", type=number_in(0.0), help="all-reduce latency per call, overriding "
                   "measured points")
    p.add_argument("--topology", metavar="FILE", help="topology file or bundled name: the target GPU. Pieces "
                   "measured on another GPU are scaled by the datasheet bandwidth ratio, ops with no measurement "
                   "get a bandwidth floor estimate (both labelled); also the default --tp")
    p.add_argument("--routed-impl", choices=ROUTED_IMPL_CHOICES, default=None,
                   help="routed experts' implementation (default: fused Marlin MoE when measured, else the first "
                   f"measured of {', '.join(ROUTED_PREFERENCE)}); 'floor' = weight bytes / datasheet bandwidth, a "
                   "stand-in for a deployed INT4 kernel that was not measured")
    return p


def _model(name: str) -> ModelSpec:
    """`get_model`, with a config file's failures naming the file."""
    if name in model_names() or not Path(name).exists():
        return get_model(name)
    try:
        return get_model(Path(name).resolve())  # resolved: a config's spec is named after its folder
    except KeyError as exc:
        raise ValueError(f"model config {name}: missing field {describe(exc)}") from None
    except (OSError, ValueError, TypeError) as exc:
        raise ValueError(f"model config {name}: {describe(exc)}") from None


def _report(path: Path) -> tuple[list[Piece], list[AllReducePoint]]:
    """`inputs_from_report`, with every failure naming the report."""
    problem = file_problem(path)
    if problem is not None:
        raise ValueError(f"--from-report: {problem}")
    try:
        return inputs_from_report(path)
    except (OSError, ValueError) as exc:
        raise ValueError(f"report {path}: {describe(exc)}") from None


def _baselines(root: Path, slug: str) -> tuple[list[Piece], list[AllReducePoint]]:
    if not root.is_dir():
        raise ValueError(f"baselines directory {root} {'is not a directory' if root.exists() else 'does not exist'}")
    if not (root / slug).is_dir():
        known = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
        raise ValueError(f"no baselines for fingerprint {slug!r} under {root} (there: {', '.join(known) or 'none'})")
    return inputs_from_baselines(root, slug)


def main_budget(argv: Sequence[str] | None = None, *, out: Callable[[str], Any] = print) -> int:
    """Print the budget table; 0 on success, 2 on bad arguments or unreadable inputs."""
    parser = _parser()
    args = parser.parse_args(list(argv) if argv is not None else None)
    if args.baselines is not None and not args.fingerprint:
        parser.error("--baselines needs --fingerprint SLUG")
    if args.fingerprint and args.baselines is None:
        parser.error("--fingerprint needs --baselines DIR")
    if args.from_report is None and args.baselines is None:  # else a table of dashes that reads "0 us"
        parser.error("give the measured numbers: --from-report PATH (a run's --moeperf-report) or --baselines DIR "
                     "--fingerprint SLUG")
    try:
        spec = _model(args.model)
        device: DeviceSpec | None = None
        tp = args.tp
        if args.topology:
            from pytest_moeperf.machine.topology import load_topology

            topo = load_topology(args.topology)
            if topo.gpus:
                device = lookup(topo.gpus[0].name)
            tp = tp or topo.gpu_count or None
        tp = tp or 8
        pieces: list[Piece] = []
        points: list[AllReducePoint] = []
        if args.from_report is not None:
            pieces, points = _report(args.from_report)
            where = f"report {args.from_report}"
        else:
            pieces, points = _baselines(args.baselines, args.fingerprint)
            where = f"baselines {args.fingerprint}"
        measured = assemble(spec, tp, args.batch, pieces, points, None, None, args.routed_impl)
        if all(row.each_us is None for row in measured.rows):  # estimates and --allreduce-us alone model nothing
            raise ValueError(f"{where} holds no measured GEMM (metric 'time', us) or all-reduce (metric "
                             f"'latency_<mode>', us) of {spec.name} at TP {tp}: nothing to model")
        budget = assemble(spec, tp, args.batch, pieces, points, args.allreduce_us, device, args.routed_impl)
    except (OSError, ValueError, KeyError, BaselineError) as exc:
        print(f"moeperf budget: {describe(exc)}", file=sys.stderr)
        return 2
    for line in budget_lines(budget):
        out(line)
    return 0
