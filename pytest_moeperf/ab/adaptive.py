"""Adaptive pairs: judge at a few looks, ``--pairs`` first and twice as many at each next look, up to
``--max-pairs`` (10 → 20 by default); after a look, only the tests with a metric that more pairs can decide (too few
pairs, or an interval that still reaches past the minimum effect) run on, in ABBA blocks.

Looking at the evidence several times and stopping once it is clear is a sequential test: judged at every look with
the full ``alpha``, each look is one more chance of a false alarm (an A/A run on a loaded 2-core box that looked
after every block, 8 looks, called one metric in 10 REGRESSED: docs/measurements/ab.md). So ``alpha`` is spent
across the planned looks (Bonferroni): each look tests, and draws its intervals, at ``alpha / looks``, which keeps
the chance of any false alarm over the whole run at most ``alpha`` under the false-discovery control of each look.
Few looks, each doubling the pairs, keep that price low. When the budget, not the evidence, ended the run, the
undecided verdicts say so (cause ``budget``) and so does a note.
"""

from __future__ import annotations

from collections.abc import Callable

from pytest_moeperf.ab.runner import Runner, metric_pairs
from pytest_moeperf.ab.verdicts import Outcome, budget_ended, decidable, judge_all
from pytest_moeperf.reports.render import counts_line


def looks(pairs: int, max_pairs: int) -> list[int]:
    """The pairs at each look: ``pairs``, then doubling, the last at ``max_pairs`` (6, 20 → 6, 12, 20)."""
    out = [min(pairs, max_pairs)]
    while out[-1] < max_pairs:
        out.append(min(max_pairs, 2 * out[-1]))
    return out


def alpha_per_look(alpha: float, pairs: int, max_pairs: int) -> float:
    return alpha / len(looks(pairs, max_pairs))


def judged(runner: Runner, alpha: float) -> dict[str, Outcome]:
    return judge_all(metric_pairs(runner.processes), alpha)


def open_tests(outcomes: dict[str, Outcome]) -> list[str]:
    """The tests with a metric that more pairs can decide."""
    return sorted({key.rpartition("::")[0] for key, o in outcomes.items() if decidable(o.verdict)})


def run(runner: Runner, pairs: int, max_pairs: int, alpha: float, echo: Callable[[str], None]
        ) -> tuple[dict[str, Outcome], list[str]]:
    """The outcomes at the last look the run needed; the notes to show (the budget)."""
    schedule = looks(pairs, max_pairs)
    level = alpha / len(schedule)
    tests: list[str] = []
    outcomes: dict[str, Outcome] = {}
    for number, target in enumerate(schedule, 1):
        while runner.pairs < target:
            runner.block(min(2, target - runner.pairs), tests)
        outcomes = judged(runner, level)
        undecided = sum(decidable(o.verdict) for o in outcomes.values())
        echo(f"moeperf ab: look {number} of at most {len(schedule)}, {runner.pairs} pairs: "
             f"{counts_line([o.verdict for o in outcomes.values()])}"
             + (f" ({undecided} can be decided by more pairs)" if undecided else ""))
        tests = open_tests(outcomes)
        if not tests:
            return outcomes, []
    note = (f"moeperf ab: {undecided} metric(s) still undecided after {runner.pairs} pairs: the pair budget "
            f"(--max-pairs {max_pairs}) ended the run, not the evidence")
    return {k: Outcome(budget_ended(o.verdict, max_pairs), o.evidence, o.q) for k, o in outcomes.items()}, [note]


def interrupted(runner: Runner, pairs: int, max_pairs: int, alpha: float, how: str = "interrupted"
                ) -> tuple[dict[str, Outcome], list[str]] | None:
    """After Ctrl-C (or a job's time limit sending SIGINT, or SIGTERM: ``how`` says which): the complete pairs judged
    as one more look at the level of the planned ones (the looks not reached are never taken, so the run's
    false-alarm bound holds); None when no pair is complete."""
    done = runner.keep_complete_pairs()
    if not done:
        return None
    by = f"the interruption after {done} pair(s)"
    outcomes = judged(runner, alpha_per_look(alpha, pairs, max_pairs))
    note = (f"moeperf ab: {how} after {done} complete pair(s) of at most {max_pairs}: judged on them; "
            f"{sum(decidable(o.verdict) for o in outcomes.values())} metric(s) more pairs could have decided")
    return {k: Outcome(budget_ended(o.verdict, max_pairs, by), o.evidence, o.q) for k, o in outcomes.items()}, [note]
