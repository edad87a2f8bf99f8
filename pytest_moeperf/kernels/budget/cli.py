"""``moeperf budget``: print a decode-step budget from a run's report, stored baselines, or given numbers."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_moeperf.kernels.budget.calc import (
    ROUTED_IMPL_CHOICES,
    ROUTED_PREFERENCE,
    AllReducePoint,
    Budget,
    Piece,
    build_budget,
    select_points,
)
from pytest_moeperf.kernels.budget.inputs import (
    family_allreduce,
    inputs_from_baselines,
    inputs_from_report,
    report_slug,
)
from pytest_moeperf.kernels.budget.render import budget_lines
from pytest_moeperf.kernels.budget.sources import Candidate, choose_allreduce, slug_family
from pytest_moeperf.kernels.devices import DeviceSpec, lookup
from pytest_moeperf.kernels.models import ModelSpec, get_model, model_names
from pytest_moeperf.settings.checks import at_least, describe, file_problem, number_in
from pytest_moeperf.store.baselines import BaselineError

if TYPE_CHECKING:
    from pytest_moeperf.machine.topology import Topology

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
                   "every other source. Without it: the --topology file's 'allreduce' entry, else GPU all-reduces "
                   "measured on TP ranks (this box's, then baselines of its slug family); else the step is shown "
                   "without all-reduce, saying why (gloo on CPU processes and fewer ranks never count)")
    p.add_argument("--topology", metavar="FILE", help="topology file or bundled name: the target GPU. Pieces "
                   "measured on another GPU are scaled by the datasheet bandwidth ratio, ops with no measurement "
                   "get a bandwidth floor estimate (both labelled); also the default --tp")
    p.add_argument("--routed-impl", choices=ROUTED_IMPL_CHOICES, default=None,
                   help="routed experts' implementation (default: fused Marlin MoE when measured, else the first "
                   f"measured of {', '.join(ROUTED_PREFERENCE)}); 'floor' = weight bytes / datasheet bandwidth, a "
                   "stand-in for a deployed INT4 kernel that was not measured")
    m = p.add_argument_group("a measured step beside the budget")
    m.add_argument("--measured", metavar="FILE", type=Path, action="append",
                   help="a `moeperf attribute --json` file (the traced step at --batch, split) or a serving run's "
                   "JSON report (engine TPOT of the c=<batch> window: the served step); repeatable, one of each. "
                   "With --topology the measured step is carried to the target (GEMMs by bandwidth, plus its "
                   "all-reduce), labelled")
    m.add_argument("--measured-profile", metavar="NAME", help="the serve profile whose window a report's served "
                   "step is taken from (needed when the report holds several)")
    m.add_argument("--measured-model", metavar="NAME", help="the model the measured server ran (registered name or "
                   "config.json path): checked to run the budget's per-rank GEMMs at --measured-tp")
    m.add_argument("--measured-tp", type=at_least(1), default=1, metavar="N",
                   help="TP of the measured server (default: %(default)s)")
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


def _candidates(args: argparse.Namespace, topo: Topology | None, points: list[AllReducePoint],
                measured_on: str | None, label: str) -> list[Candidate]:
    """The all-reduce sources in the order :func:`choose_allreduce` tries them."""
    out: list[Candidate] = []
    if args.allreduce_us is not None:
        out.append(Candidate("given (--allreduce-us)", fixed_us=args.allreduce_us))
    target = topo.fingerprint.slug if topo is not None else measured_on
    if topo is not None and topo.allreduce:
        out.append(Candidate(f"topology file {Path(topo.source).name}", tuple(
            AllReducePoint(f.bytes, f.us, f.backend, f.world, f.source, f.mode, "stated") for f in topo.allreduce)))
    if label:
        refused = ""
        if topo is not None and measured_on is None:
            refused = f"the box it was measured on is not named; the target is {target}"
        elif topo is not None and measured_on is not None and slug_family(measured_on) != slug_family(target or ""):
            refused = f"measured on {measured_on}, the target is {target}"
        out.append(Candidate(label, tuple(points), refused=refused))
    if args.baselines is not None and target:
        for slug, found in family_allreduce(args.baselines, target, skip=measured_on):
            out.append(Candidate(f"baselines {slug} (slug family {slug_family(target)})", tuple(found)))
    return out


def _versus(args: argparse.Namespace, budget: Budget, pieces: list[Piece], device: DeviceSpec | None) -> list[str]:
    """The budget-vs-measured table; with a target device the measured step carried there from the pieces' GPU."""
    from pytest_moeperf.kernels.budget.measured import measured_steps
    from pytest_moeperf.kernels.budget.versus import scaled, shape_mismatch, versus, versus_lines

    if args.measured_model:
        problem = shape_mismatch(_model(args.model), budget.tp, _model(args.measured_model), args.measured_tp)
        if problem is not None:
            raise ValueError(f"--measured-model: {problem}")
    traced, served = measured_steps(list(args.measured), budget.batch, args.measured_profile)
    if device is not None:
        origins = {p.device for p in pieces if p.device}
        if len(origins) != 1:
            raise ValueError("--measured with --topology: the GEMM pieces name "
                             f"{'no device' if not origins else 'several devices'}, so the measured box's GPU "
                             "(what the step is carried from) is not known")
        origin = lookup(origins.pop())
        if origin.mem_bw_bytes_s is None or device.mem_bw_bytes_s is None:
            raise ValueError(f"--measured with --topology: no datasheet bandwidth for {origin.name} or {device.name}")
        ratio = origin.mem_bw_bytes_s / device.mem_bw_bytes_s
        split = traced
        traced = scaled(traced, ratio, device.name, budget) if traced is not None else None
        served = scaled(served, ratio, device.name, budget, split) if served is not None else None
    return versus_lines(versus(budget, traced, served))


def main_budget(argv: Sequence[str] | None = None, *, out: Callable[[str], Any] = print) -> int:
    """Print the budget table (and the measured step beside it); 0 on success, 2 on bad arguments or unreadable
    inputs."""
    parser = _parser()
    args = parser.parse_args(list(argv) if argv is not None else None)
    if args.baselines is not None and not args.fingerprint:
        parser.error("--baselines needs --fingerprint SLUG")
    if args.fingerprint and args.baselines is None:
        parser.error("--fingerprint needs --baselines DIR")
    if args.from_report is None and args.baselines is None:  # else a table of dashes that reads "0 us"
        parser.error("give the measured numbers: --from-report PATH (a run's --moeperf-report) or --baselines DIR "
                     "--fingerprint SLUG")
    if not args.measured and (args.measured_profile or args.measured_model):
        parser.error("--measured-profile and --measured-model need --measured FILE")
    try:
        spec = _model(args.model)
        device: DeviceSpec | None = None
        topo = None
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
        measured_on, label = None, ""
        if args.from_report is not None:
            pieces, points = _report(args.from_report)
            measured_on, label = report_slug(args.from_report), f"report {args.from_report.name}"
            where = f"report {args.from_report}"
        else:
            pieces, points = _baselines(args.baselines, args.fingerprint)
            measured_on, label = args.fingerprint, f"baselines {args.fingerprint}"
            where = label
        own = build_budget(spec, tp, args.batch, pieces, select_points(points, tp) or None,
                           routed_impl=args.routed_impl)
        if all(row.each_us is None for row in own.rows):  # estimates and --allreduce-us alone model nothing
            raise ValueError(f"{where} holds no measured GEMM (metric 'time', us) or all-reduce (metric "
                             f"'latency_<mode>', us) of {spec.name} at TP {tp}: nothing to model")
        choice = choose_allreduce(tp, _candidates(args, topo, points, measured_on, label))
        allreduce = choice.fixed_us if choice.fixed_us is not None else (choice.points or None)
        budget = build_budget(spec, tp, args.batch, pieces, allreduce, device=device, allreduce_source=choice.source,
                              routed_impl=args.routed_impl, without_allreduce=choice.without)
        lines = budget_lines(budget)
        if choice.found and choice.set_aside:
            lines.append("All-reduce figures set aside: " + "; ".join(choice.set_aside) + ".")
        if args.measured:
            lines += ["", *_versus(args, budget, pieces, device)]
    except (OSError, ValueError, KeyError, BaselineError) as exc:
        print(f"moeperf budget: {describe(exc)}", file=sys.stderr)
        return 2
    for line in lines:
        out(line)
    return 0
