"""Where a budget's all-reduce term comes from, and when a step goes without one (pure).

A TP=N decode step pays ``1 + 2 × layers`` all-reduces on N GPUs. A figure measured another way says nothing
about them: gloo between CPU processes (what a 1-GPU or CPU box measures: on a 1×H200, 2 processes at 222.7 µs
each made all-reduce 77.6 % of a "35.3 ms TP=8 step" no GPU box has), or fewer ranks than N. So the all-reduce
term comes from the first source that answers, in this order:

1. a figure given on the command line (``--allreduce-us``, the batch's ``--budget-allreduce-us``);
2. the target topology file's ``allreduce`` entries (a figure carried with the file: the bundled
   ``8x-rtx-pro-6000-pcie`` carries the investigation's own per-call figure);
3. measured points: this box's report or baselines, then the baselines of the same slug family (the slug without
   its GPU count: same GPU model and interconnect) — each point only when a GPU backend measured it on exactly N
   ranks, and only when the box measured is of the target's family.

When none answers, the step is shown without all-reduce and the budget says why, naming what was measured and
set aside: never a TP=N step built from a CPU gloo figure or from fewer ranks.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from dataclasses import dataclass

from pytest_moeperf.kernels.budget.calc import AllReducePoint, select_points

__all__ = ["CPU_BACKENDS", "AllReduceChoice", "Candidate", "choose_allreduce", "point_problem", "slug_family"]

#: all-reduce backends that run between CPU processes (the suite's ``gloo``): never a GPU step's all-reduce
CPU_BACKENDS = ("gloo",)


def slug_family(slug: str) -> str:
    """A fingerprint slug without its GPU count: ``8x-h200-nvlink`` and ``2x-h200-nvlink`` are ``h200-nvlink``; a
    1-GPU slug (no interconnect) and an emulation (``+pcie-no-p2p``) are families of their own."""
    return re.sub(r"^\d+x-", "", slug)


def point_problem(point: AllReducePoint, tp: int) -> str | None:
    """Why ``point`` cannot stand for one all-reduce of a TP=``tp`` step (None: it can)."""
    if point.backend in CPU_BACKENDS:
        return f"{point.backend} runs between CPU processes, not GPUs"
    if point.world_size == 0:
        return "its rank count is not recorded"
    if point.world_size != tp:
        return f"{point.world_size} ranks measured, TP={tp} needs {tp}"
    return None


@dataclass(frozen=True)
class Candidate:
    """One source of an all-reduce term: a fixed figure, or points by message size. ``refused`` sets the whole
    source aside before its points are looked at (measured on a box of another family than the target)."""

    label: str
    points: tuple[AllReducePoint, ...] = ()
    fixed_us: float | None = None
    refused: str = ""


@dataclass(frozen=True)
class AllReduceChoice:
    """The all-reduce term of a budget: a fixed figure, points, or nothing (``without`` says why)."""

    source: str
    points: tuple[AllReducePoint, ...] = ()
    fixed_us: float | None = None
    without: str = ""
    set_aside: tuple[str, ...] = ()

    @property
    def found(self) -> bool:
        return self.fixed_us is not None or bool(self.points)


def _set_aside(candidate: Candidate, tp: int) -> list[str]:
    """One line per kind of point the source held (backend, mode, ranks) and why it does not answer."""
    if candidate.refused:
        return [f"{candidate.label}: {candidate.refused}"]
    seen: dict[tuple[str, str, int], str] = {}
    for p in candidate.points:
        problem = point_problem(p, tp)
        if problem is not None:
            seen.setdefault((p.backend, p.mode, p.world_size), problem)
    return [f"{candidate.label}: {backend}{' ' + mode if mode else ''} on {world or '?'} ranks ({problem})"
            for (backend, mode, world), problem in sorted(seen.items())]


def choose_allreduce(tp: int, candidates: Sequence[Candidate]) -> AllReduceChoice:
    """The first candidate that answers for a TP=``tp`` step (see the module's rules); TP=1 needs none."""
    if tp == 1:
        return AllReduceChoice(source="TP=1: no all-reduce")
    set_aside: list[str] = []
    for c in candidates:
        if c.refused:
            set_aside += _set_aside(c, tp)
            continue
        if c.fixed_us is not None:
            return AllReduceChoice(source=c.label, fixed_us=c.fixed_us, set_aside=tuple(set_aside))
        usable = [p for p in c.points if point_problem(p, tp) is None]
        set_aside += _set_aside(c, tp)
        if usable:
            chosen = tuple(dataclasses.replace(p, source=f"{c.label}; {p.source}" if p.source and p.source != c.label
                                               else c.label) for p in select_points(usable, tp))
            return AllReduceChoice(source=c.label, points=chosen, set_aside=tuple(set_aside))
    held = "; ".join(set_aside) if set_aside else "no all-reduce measured"
    why = (f"no all-reduce figure for TP={tp} on {tp} GPUs ({held}); name one: --allreduce-us, a topology file with "
           f"an 'allreduce' entry, or GPU baselines of this slug family measured on {tp} ranks")
    return AllReduceChoice(source="", without=why, set_aside=tuple(set_aside))
