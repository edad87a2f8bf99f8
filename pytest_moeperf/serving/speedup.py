"""How a candidate's TPOT speedup over its reference is measured without two servers fighting for one box.

* ``alternating windows``: both servers fit at once (or are attached): per round, a reference window then a
  candidate window on the same prompts; speedup = reference TPOT / candidate TPOT per round.
* ``A-B-A restarts``: they do not fit (CPU: one server at a time; GPU: memory shares): reference up, its windows;
  candidate up (the pool stops the reference), its windows; reference up again, its windows. Per round, speedup
  = mean of the two reference TPOTs / the candidate's; the drift (second reference ÷ first) is reported, so a box
  that changed under the measurement shows. One A-B-A serves every concurrency of the pair (three server starts,
  not three per test).

``measure(served, concurrency, round)`` returns one window's TPOT in ms (the suite chooses which TPOT).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from pytest_moeperf.serving.lifecycle.served import Served

__all__ = ["ABA", "ALTERNATING", "PairResult", "measure_pair"]

ALTERNATING = "alternating windows"
ABA = "A-B-A restarts"

Measure = Callable[[Served, int, int], float]


class Launcher(Protocol):
    def __call__(self, name: str, *, keep: Sequence[str] = ()) -> Served: ...


@dataclass(frozen=True)
class PairResult:
    """Per concurrency: the speedup of each round; the method; the reference drift (A-B-A only, per round)."""

    method: str
    speedups: dict[int, list[float]]
    drift: dict[int, list[float]]


def measure_pair(
    get: Launcher,
    reference: str,
    candidate: str,
    concurrencies: Sequence[int],
    rounds: int,
    measure: Measure,
    *,
    fit_together: bool,
) -> PairResult:
    if fit_together:
        speedups: dict[int, list[float]] = {}
        for c in concurrencies:
            ratios = []
            for r in range(rounds):
                ref_tpot = measure(get(reference, keep=[candidate]), c, r)
                cand_tpot = measure(get(candidate, keep=[reference]), c, r)
                ratios.append(ref_tpot / cand_tpot)
            speedups[c] = ratios
        return PairResult(ALTERNATING, speedups, {})
    phases: list[dict[int, list[float]]] = []
    for name in (reference, candidate, reference):
        served = get(name)
        phases.append({c: [measure(served, c, r) for r in range(rounds)] for c in concurrencies})
    first, cand, second = phases
    return PairResult(
        ABA,
        {c: [statistics.fmean((a, b)) / x for a, b, x in zip(first[c], second[c], cand[c], strict=True)]
         for c in concurrencies},
        {c: [b / a for a, b in zip(first[c], second[c], strict=True)] for c in concurrencies},
    )  # fmt: skip
