"""Pure: the machine measure. Has the canary (`machine.canary`) moved beyond its own stored spread, and which
IMPROVED and REGRESSED verdicts does its move explain?

1. **The canary moved** (`CanaryMove.moved`): beside a test file, a workload's figure this session (the median
   over its rounds of each round's pooled median) differs from the median of this host's stored figures (at least
   `MIN_FIGURES`: one per stored round) by more than ``max(K x their spread, MIN_MOVE)`` and lies beyond every one
   of them on that side (MongoDB's rule: a canary outlier). While this host has fewer figures, every other host's
   stand in (`machine_judge`): a fresh CI machine judged against baselines recorded elsewhere is a machine unlike
   the one that recorded them, which is what the canary is there to see.
2. **A family matches it** (`Match`): the cases of the verdict's sub-family (`ledger.SUBFAMILY`: the cases of a test
   that share the context values its ``moeperf_family`` marker names, e.g. GEMM dtype x M), or of its whole family
   (one test file, one metric name) when the sub-family has fewer than `MIN_CASES` judged cases, moved with the
   canary: their median change, as a log change in the worse direction (slower), has the sign of the canary's log
   change and is between 1/`RATIO` and `RATIO` times it (same direction, comparable size), and a one-sided sign
   test in the canary's direction gives p < `ALPHA`. The direction is given by an independent measurement, so the
   test is one-sided: all of 5 cases one way is p = 1/32, the smallest family that can agree at 0.05; the
   two-sided whole-family test of `judging.shift` at 0.01 needs 8. A whole family of fewer than `MIN_CASES`
   judged cases (a spec-decode metric over 2 profiles x 2 concurrencies: 4; a start-up time: 1) is too small for
   the test; it matches when **every** case moved the canary's way and the median is of comparable size
   (`Match.tested` is then False, and the reason says so). Seen in clean-clone CI runs on the 2-core box: spec-decode
   ``engine_step_ms`` +13..+43 % in all 4 cases beside a compute canary +54 % (and +60 % beside +76 % the day
   before) read REGRESSED because 4 cases cannot pass a sign test at 0.05.
3. **A case's move is the machine's**: it moved the family's way and by no more than the family's median move plus
   its own mde (log changes): then the verdict reads INCONCLUSIVE, cause ``machine``, with the canary's figures in
   its reason. A move the canary does not share stays decided: a case beyond its family's move by more than its mde
   (x1.15 on one case of a family that moved +10 % reads +15 % beyond), a family that did not move with the canary,
   a move against the machine's. A gross change (x`GROSS_FACTOR` or more, `verdict.gross_factor`'s rule) stays
   decided.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from pytest_moeperf.judging import stats
from pytest_moeperf.judging.shift import sign_test_p
from pytest_moeperf.judging.verdict import GROSS_FACTOR, Cause, Status, Verdict
from pytest_moeperf.ledger import Section
from pytest_moeperf.machine.canary import UNIT, Reading, key_of

__all__ = ["ALPHA", "K", "MACHINE_MOVED", "MIN_CASES", "MIN_FIGURES", "MIN_MOVE", "RATIO", "CanaryMove", "Match",
           "canary_moves", "canary_verdicts", "figure", "machine_notes", "machine_section", "machine_verdicts",
           "moved_slower"]

MIN_FIGURES = 3  # stored figures of this host before the canary's spread is known
K = 3.0  # as the metrics' noise_k: a move beyond 3 robust sigmas of the stored figures
MIN_MOVE = 0.03  # the quiet floor: a smaller move of the machine cannot move a verdict past its mde
RATIO = 2.0  # "comparable size": the family moved between half and twice the canary's move
ALPHA = 0.05
MIN_CASES = 5  # all of 5 cases one way: one-sided p = 1/32 < ALPHA
TIE = 0.001  # |log change| at or below 0.1 % is no move (as `shift.TIE`)
#: how the reason of a verdict beside a moved canary says so (the summary counts the REGRESSED ones that stand)
MACHINE_MOVED = "the machine moved: "


@dataclass(frozen=True)
class CanaryMove:
    """One workload of the canary beside one test file: this session's figure against this host's stored ones."""

    file: str
    workload: str
    current: float  # µs: the median of the round figures
    rounds: tuple[float, ...]  # each round's figure (the median of its pooled samples)
    samples: tuple[float, ...]  # every sample of the session
    stored: tuple[float, ...] = ()  # this host's stored figures, oldest first
    #: whose figures ``stored`` are: "this host", or "other hosts" while this one has fewer than `MIN_FIGURES`
    source: str = "this host"

    @property
    def reference(self) -> float | None:
        return stats.median(self.stored) if len(self.stored) >= MIN_FIGURES else None

    @property
    def spread(self) -> float | None:
        return stats.relative_spread(self.stored) if self.reference else None

    @property
    def allowed(self) -> float:
        return max(K * (self.spread or 0.0), MIN_MOVE)

    @property
    def change(self) -> float | None:
        return self.current / self.reference - 1.0 if self.reference else None

    @property
    def moved(self) -> bool:
        change = self.change
        if change is None or abs(change) <= self.allowed:
            return False
        return self.current > max(self.stored) if change > 0 else self.current < min(self.stored)

    @property
    def state(self) -> str:
        if self.reference is None:
            return f"learning ({len(self.stored)} of {MIN_FIGURES} runs)"
        return "moved" if self.moved else "steady"

    def describe(self) -> str:
        if self.reference is None or self.change is None:
            return f"canary {self.workload} beside {self.file}: {self.current:.4g} {UNIT}, {self.state}"
        return (f"canary {self.workload} beside {self.file} {_pct(self.change)} ({self.current:.4g} {UNIT} against "
                f"{self.reference:.4g} {UNIT} over {len(self.stored)} stored runs of {self.source}, spread "
                f"{100 * (self.spread or 0.0):.1f} %, allowed {100 * self.allowed:.1f} %)")


@dataclass(frozen=True)
class Match:
    """A family that moved with a moved canary workload, and what that did to its verdicts."""

    file: str
    name: str
    subfamily: str  # "" : the whole family
    cases: int
    with_canary: int  # cases that moved the canary's way
    move: float  # the family's median change in the worse direction, as a log change
    p: float  # one-sided sign test in the canary's direction
    canary: CanaryMove
    explained: int = 0
    stands: int = 0
    tested: bool = True  # False: fewer than `MIN_CASES` cases, every one of them the canary's way (no sign test)

    @property
    def label(self) -> str:
        return f"{self.file.rsplit('/', 1)[-1]} {self.name}" + (f" [{self.subfamily}]" if self.subfamily else "")


def _pct(x: float) -> str:
    return f"{100 * x:+.1f} %"


def figure(readings: Sequence[Reading]) -> tuple[float, tuple[float, ...]]:
    """The figure of one workload's readings beside one file, and each round's: the median of a round's pooled
    samples, then the median of the rounds."""
    by_round: dict[str, list[float]] = {}
    for reading in readings:
        by_round.setdefault(reading.origin, []).extend(reading.samples)
    rounds = tuple(stats.median(samples) for samples in by_round.values())
    return stats.median(rounds), rounds


def canary_moves(readings: Sequence[Reading], stored: Mapping[str, Sequence[float]],
                 borrowed: Collection[str] = ()) -> list[CanaryMove]:
    """Each (test file, workload) read this session, against its stored figures (by `Reading.key`; those of the
    keys in ``borrowed`` are other hosts')."""
    grouped: dict[tuple[str, str], list[Reading]] = {}
    for reading in readings:
        grouped.setdefault((reading.file, reading.workload), []).append(reading)
    moves = []
    for (file, workload), found in sorted(grouped.items()):
        current, rounds = figure(found)
        moves.append(CanaryMove(file, workload, current, rounds, tuple(x for r in found for x in r.samples),
                                tuple(stored.get(found[0].key, ())),
                                "other hosts" if found[0].key in borrowed else "this host"))
    return moves


def moved_slower(moves: Sequence[CanaryMove], file: str) -> CanaryMove | None:
    """A workload of the canary beside ``file`` that moved slower (a REGRESSED there may be the machine's)."""
    return next((m for m in moves if m.file == file and m.moved and (m.change or 0.0) > 0), None)


def _worse(v: Verdict) -> float:
    """A verdict's change as a log change, positive when worse (for a time: slower)."""
    assert v.change is not None
    log = math.log1p(v.change)
    return log if v.better == "lower" else -log


def _match(file: str, name: str, subfamily: str, members: Sequence[Verdict], moved: Sequence[CanaryMove]
           ) -> Match | None:
    worse = [_worse(v) for v in members]
    move = stats.median(worse)
    tested = len(members) >= MIN_CASES
    best: tuple[float, Match] | None = None
    for canary in moved:
        log = math.log1p(canary.change or 0.0)
        if move * log <= 0 or not 1 / RATIO <= move / log <= RATIO:
            continue
        sign = 1.0 if log > 0 else -1.0
        with_canary = sum(1 for w in worse if w * sign > TIE)
        against = sum(1 for w in worse if w * sign < -TIE)
        p = sign_test_p(with_canary, against) / 2 if with_canary > against else 1.0  # one-sided
        score = abs(math.log(move / log))
        agrees = p < ALPHA if tested else with_canary == len(worse)
        if agrees and (best is None or score < best[0]):
            best = score, Match(file, name, subfamily, len(members), with_canary, move, p, canary, tested=tested)
    return None if best is None else best[1]


def machine_verdicts(verdicts: Mapping[str, Verdict], subfamilies: Mapping[str, str], moves: Sequence[CanaryMove]
                     ) -> tuple[dict[str, Verdict], list[Match]]:
    """The IMPROVED and REGRESSED verdicts (by key) of test files whose canary moved, as they now read (the module's
    rules 2 and 3), and the families that moved with the canary."""
    moved: dict[str, list[CanaryMove]] = {}
    for canary in moves:
        if canary.moved:
            moved.setdefault(canary.file, []).append(canary)
    groups: dict[tuple[str, str, str], list[Verdict]] = {}
    for key, v in verdicts.items():
        file = key.split("::")[0]
        if file in moved and v.change is not None and math.isfinite(v.change) and v.change > -1 and v.mde is not None:
            groups.setdefault((file, v.name, ""), []).append(v)
            if subfamilies.get(key):
                groups.setdefault((file, v.name, subfamilies[key]), []).append(v)
    matches: dict[tuple[str, str, str], Match | None] = {}
    changed: dict[str, Verdict] = {}
    for key, v in verdicts.items():
        group = (key.split("::")[0], v.name, subfamilies.get(key, ""))
        if v.status not in (Status.IMPROVED, Status.REGRESSED) or group[0] not in moved or v.change is None:
            continue
        if len(groups.get(group, ())) < MIN_CASES:
            group = (group[0], group[1], "")
        if group not in matches:
            members = groups.get(group, [])
            matches[group] = _match(*group, members, moved[group[0]]) if members else None
        match = matches[group]
        canary = moved[group[0]][0] if match is None else match.canary
        if match is None:
            changed[key] = _noted(v, f"{MACHINE_MOVED}the {canary.describe()}, but this case's family did not move "
                                     "with it (same direction, comparable size): decided")
            continue
        worse, sign = _worse(v), 1.0 if match.move > 0 else -1.0
        how = (f"{match.with_canary} of {match.cases} cases, one-sided sign test p = {match.p:.2g}" if match.tested
               else f"all {match.cases} of its case(s), too few for a sign test at {ALPHA:g}: every one moved the "
                    "canary's way")
        family = f"{match.label} moved {_pct(math.expm1(match.move))} worse with it ({how})"
        gross = v.cause == Cause.GROSS or abs(math.log1p(v.change)) >= math.log(GROSS_FACTOR)
        if not gross and worse * sign > 0 and (worse - match.move) * sign <= math.log1p(v.mde or 0.0):
            matches[group] = dataclasses.replace(match, explained=match.explained + 1)
            changed[key] = dataclasses.replace(
                v, status=Status.INCONCLUSIVE, cause=Cause.MACHINE,
                reason=f"{v.reason}; {MACHINE_MOVED}the {canary.describe()}, and {family}: this case's "
                       f"{_pct(v.change)} is within its mde of that move (run again on a settled machine)")
        else:
            matches[group] = dataclasses.replace(match, stands=match.stands + 1)
            why = (f"a gross change (x{GROSS_FACTOR:g} or more)" if gross else
                   f"this case moved {_pct(math.expm1((worse - match.move) * sign))} beyond that move")
            changed[key] = _noted(v, f"{MACHINE_MOVED}the {canary.describe()}, and {family}; {why}: decided")
    return changed, [m for m in matches.values() if m is not None]


def _noted(v: Verdict, note: str) -> Verdict:
    return dataclasses.replace(v, reason="; ".join([*([v.reason] if v.reason else []), note]))


def machine_section(moves: Sequence[CanaryMove], matches: Sequence[Match]) -> list[Section]:
    """The report table of the canary beside each test file (none when it was not read)."""
    if not moves:
        return []
    rows = []
    for m in moves:
        families = "; ".join(f"{x.label} {_pct(math.expm1(x.move))} ({x.with_canary}/{x.cases}): {x.explained} "
                             f"INCONCLUSIVE, {x.stands} decided" for x in matches if x.canary == m)
        rows.append((m.file, m.workload, f"{m.current:.4g}", "-" if m.reference is None else f"{m.reference:.4g}",
                     str(len(m.stored)), "-" if m.change is None else _pct(m.change), f"{100 * m.allowed:.1f} %",
                     m.state, families or "-"))
    note = ("Fixed workloads no change of the code under test touches, timed beside each test file's tests (CPU "
            "thread time; GPU CUDA graphs + events), against this host's stored figures. A canary that moved "
            f"beyond max({K:g} spreads, {100 * MIN_MOVE:g} %) and every stored figure measured a machine move: a "
            "family that moved with it (same direction, between half and twice its move, sign test p < "
            f"{ALPHA:g}) has its verdicts within their mde of the family's move INCONCLUSIVE (cause machine); "
            "a case beyond that move, or a gross change, stays decided. Figures in us per call.")
    return [Section("Machine: the canary beside each test file", ("test file", "workload", "current", "stored",
                                                                   "runs", "change", "allowed", "state",
                                                                   "families moved with it"), tuple(rows), note)]


def machine_notes(moves: Sequence[CanaryMove], matches: Sequence[Match]) -> list[str]:
    """One summary line when the canary moved."""
    moved = [m for m in moves if m.moved]
    if not moved:
        return []
    named = ", ".join(f"{m.file.rsplit('/', 1)[-1]} {m.workload} {_pct(m.change or 0.0)}" for m in moved[:4])
    explained, stands = sum(m.explained for m in matches), sum(m.stands for m in matches)
    return [f"moeperf: machine: the canary moved beyond its stored spread ({named}{' …' if len(moved) > 4 else ''}); "
            f"{explained} verdict(s) it explains are INCONCLUSIVE (cause machine), {stands} moved beyond it and "
            "stand; see 'Machine' in the report"]


def canary_verdicts(moves: Sequence[CanaryMove]) -> list[Verdict]:
    """The canary's figures as verdict-shaped entries for the JSON report and the history (its series): PASS when
    steady, INCONCLUSIVE (cause machine) when it moved, NEW while its spread is being learned."""
    out = []
    for m in moves:
        status = Status.NEW if m.reference is None else Status.INCONCLUSIVE if m.moved else Status.PASS
        spread = "" if m.spread is None else f"canary spread {100 * m.spread:.1f} % over {len(m.stored)} runs"
        out.append(Verdict(key_of(m.file, m.workload), m.workload, UNIT, "lower", status,
                           stats.summarize(m.samples), m.rounds, m.reference, len(m.stored), m.change,
                           None if m.reference is None else m.allowed, spread, "baseline" if m.reference else "",
                           reason=m.describe(), cause=Cause.MACHINE if m.moved else ""))
    return out

