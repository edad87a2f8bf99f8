"""Pure: has the whole machine moved since its baselines were recorded, and which case moved against its family?

Each verdict compares one metric with its own stored runs. When every case of a family (one test file, one
metric name: the 26 CPU GEMM ``time`` cases, say) moves the same way at once, the code under test rarely did it:
the box did. Seen on a freshly booted 2-core CI VM, at the commit that recorded the CPU baselines: every family of
every suite 10-24 % faster (GEMM ``time`` median -18.3 % over 26 of 26 cases, gloo latency -13.7 %, serving TPOT
-17.1 %). Two things follow, and the report says both:

* a change of the whole family smaller than the shift cannot be told from the box's own move, whichever way;
* a case can move against its family. Its **relative change** divides this session's family move out of its
  change, and its **relative threshold** comes from its stored runs with each run's family move divided out the
  same way (runs of one update are told apart by their position: round k of an update is run k of every metric
  it wrote). On the CPU baselines of three sittings that cuts the GEMM ``time`` spread from 14.1 % to 5.8 %
  (median over 26 cases): the box's state is common to a family, most of the rest is the case's own noise.
  A case beyond its relative threshold is listed as a relative outlier: a lead to look at, not a verdict.

A family counts as moved when an exact two-sided sign test over its cases rejects "no common direction" at
``ALPHA`` and the median change is at least ``MIN_SHIFT``. Families of fewer than ``MIN_CASES`` cases are not
looked at (all of n cases one way is p = 2^(1-n): below 0.01 from 8). A **sub-family** (the cases of a test that
share the context values its ``moeperf_family`` marker names: CPU GEMM ``time`` at dtype bf16 and M = 1 is 14 of
the 26 cases) is looked at as a family of its own by the same rule (its cases are also in their whole family's
view): a box can move the memory-bound cases alone. Smaller sub-families are left to the canary (`machine`).
The view changes no verdict on this host's baselines (an IMPROVED or REGRESSED inside a moved family says "likely
the machine"), unless every stored run of the metric is of this run's code (`same_code`: the same files of the
checkout, less the baselines and what ``--moeperf-code-exclude`` names, and the same software, driver and
environment): then only the machine can have moved it, and the verdict is
INCONCLUSIVE with cause ``machine`` (seen in a same-box CPU A/A: the whole GEMM family +8.8 %, 16 of 16 cases, every
round healthy, and one case REGRESSED at p = 0.012). A gross change stays decided. Against other hosts' baselines a
family that moved as a whole is what another host looks like, so its verdicts there are INCONCLUSIVE
(`in_moved_families`).

A family that moved **together by less than its common mde** (sign test p < ``ALPHA``; `Family.together`) moved by
an amount its own stored runs show between themselves: each stored run's family move (the median over the cases of
the run's median over the case's reference) varies from run to run with the box, and the **common mde**
(`common_mde`) is max(``MIN_SHIFT``, 3 x the spread of those moves). No single session tells such a move from the
machine's: the same code read the CPU GEMM family +0.4 .. +2.8 % between clean-clone runs (common mde 5 %, its runs'
moves 0.983 .. 1.016), the CPU gloo family +10 .. +19 % between sittings (common mde 18.8 %: runs 0.909 .. 1.190).
Its IMPROVED and REGRESSED verdicts are judged again on each round median with the family's move divided out
(`beside_common_moves`): a case stays decided only when every such round is still beyond its mde, else it is
INCONCLUSIVE with cause ``family``. Seen at one code on the AMD CI VM: with the GEMM family +2.6 % (24 of 26 cases),
three bf16 GEMMs read REGRESSED at p = 0.013 (+5.1, +6.3, +16.0 %; with the family divided out +1.0 and +3.8 %
against an mde of 3.0 %, +1.7 and +3.1 % against 4.2 %, +2.4 and +23.8 % against 4.3 %), while a x1.15 injected into
one case reads +13.6 and +15.7 % beyond the family's move and stays REGRESSED. A common move beyond the common mde
is a finding (the "Machine shift" table when it is ``MIN_SHIFT`` or more; its verdicts stand). The move is known
only at the session's end, so a REGRESSED that a common move within the common mde could explain (`awaits_family`)
does not fail its test at once in a family of ``MIN_CASES`` or more tests: the session's end decides it, and one
that stands then fails the session.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pytest_moeperf.judging import stats
from pytest_moeperf.judging.verdict import LIKELY_THE_MACHINE, Cause, Status, Verdict
from pytest_moeperf.ledger import Section

__all__ = ["ALPHA", "FAMILY_NOTE", "MIN_CASES", "MIN_SHIFT", "Family", "Outlier", "StoredRuns", "awaited_lines",
           "awaits_family", "beside_common_moves", "common_mde", "family_views", "in_moved_families", "same_code",
           "shift_notes", "shift_sections", "sign_test_p"]

ALPHA = 0.01  # several families per session: at 0.01 a family needs >= 8 cases all one way
MIN_CASES = 8
MIN_SHIFT = 0.05  # the default minimum effect: a smaller common move is within what one sitting shows
TIE = 0.001  # |change| at or below 0.1 % is no move (acceptance rates repeat exactly)
MIN_RELATIVE_RUNS = 3  # stored runs with a known family move needed for a relative spread
COMMON_K = 3.0  # as the metrics' noise_k: a common move beyond 3 robust sigmas of the stored runs' family moves
SHOWN_OUTLIERS = 5
#: how a verdict judged again on its family's common move says so (`beside_common_moves`)
FAMILY_NOTE = "moved together within its common mde"

#: metric key -> its stored runs as (date of the update that wrote it, median), oldest first
StoredRuns = Mapping[str, Sequence[tuple[str | None, float]]]


@dataclass(frozen=True)
class Outlier:
    key: str
    change: float  # absolute, signed
    relative: float  # against the family's move this session, signed
    allowed: float  # the relative threshold


@dataclass(frozen=True)
class Family:
    family: str  # the test file
    name: str  # the metric name
    unit: str
    better: str
    cases: int
    same_direction: int  # cases that moved the way the median did
    median_change: float  # signed, relative
    low: float
    high: float
    p: float  # two-sided sign test
    median_allowed: float  # of the absolute thresholds
    median_relative: float | None  # of the relative thresholds (None: no stored runs to learn them from)
    outliers: tuple[Outlier, ...]
    improved: int = 0  # IMPROVED verdicts in the family
    regressed: int = 0  # REGRESSED verdicts in the family
    subfamily: str = ""  # "" : the whole family; else the sub-family's context values (`ledger.SUBFAMILY`)
    common: float = MIN_SHIFT  # the least common move its stored runs do not show between themselves (`common_mde`)

    @property
    def label(self) -> str:
        return self.family + (f" [{self.subfamily}]" if self.subfamily else "")

    def holds(self, key: str, name: str, subfamily: str = "") -> bool:
        """Whether metric ``key`` (its name, its sub-family) is one of this family's cases."""
        return (name == self.name and key.split("::")[0] == self.family
                and (not self.subfamily or subfamily == self.subfamily))

    @property
    def moved(self) -> bool:
        return self.p < ALPHA and abs(self.median_change) >= MIN_SHIFT

    @property
    def together(self) -> bool:
        """Moved together (sign test p < ``ALPHA``) by less than its common mde (`common_mde`, at least
        ``MIN_SHIFT``): a common move no single session tells from the machine's (`beside_common_moves`)."""
        return self.p < ALPHA and TIE < abs(self.median_change) < self.common

    @property
    def word(self) -> str:
        worse = self.median_change > 0 if self.better == "lower" else self.median_change < 0
        return "worse" if worse else "better"


def sign_test_p(plus: int, minus: int) -> float:
    """Exact two-sided sign test: the chance of a split at least this lopsided if each way were equally likely."""
    n, k = plus + minus, max(plus, minus)
    if n == 0:
        return 1.0
    tail: float = sum(math.comb(n, i) for i in range(k, n + 1)) / 2.0 ** n
    return min(1.0, 2 * tail)


def _worse(better: str, change: float) -> float:
    return change if better == "lower" else -change


def _run_moves(keys: Iterable[str], stored: StoredRuns
               ) -> tuple[dict[tuple[str | None, int], float], dict[str, list[tuple[tuple[str | None, int], float]]]]:
    """Each stored run's family move (the median over the family's cases of the run's median over the case's
    reference; runs of fewer than ``MIN_CASES`` cases are left out), and each key's runs as (run, ratio)."""
    tagged: dict[str, list[tuple[tuple[str | None, int], float]]] = {}
    for key in keys:
        runs = stored.get(key, ())
        ref = stats.median([m for _, m in runs]) if runs else 0.0
        if not ref:
            continue
        seen: dict[str | None, int] = {}
        for date, median in runs:
            seen[date] = seen.get(date, -1) + 1  # round k of an update is its k-th run of that date
            tagged.setdefault(key, []).append(((date, seen[date]), median / ref))
    by_run: dict[tuple[str | None, int], list[float]] = {}
    for runs_of_key in tagged.values():
        for run, ratio in runs_of_key:
            by_run.setdefault(run, []).append(ratio)
    return {run: stats.median(r) for run, r in by_run.items() if len(r) >= MIN_CASES}, tagged


def _relative_runs(keys: Sequence[str], stored: StoredRuns) -> dict[str, list[float]]:
    """Each key's stored run medians over its reference, each divided by its run's family move."""
    move, tagged = _run_moves(keys, stored)
    return {key: [ratio / move[run] for run, ratio in runs_of_key if run in move and move[run] > 0]
            for key, runs_of_key in tagged.items()}


def common_mde(keys: Iterable[str], stored: StoredRuns, noise_k: float = COMMON_K) -> float:
    """The least common move of a family (its cases ``keys``) that its stored runs do not show between themselves:
    max(``MIN_SHIFT``, ``noise_k`` x the spread of the stored runs' family moves); ``MIN_SHIFT`` with fewer than
    ``MIN_RELATIVE_RUNS`` such runs. A smaller common move is the machine's as far as one session can tell
    (`beside_common_moves`)."""
    moves = list(_run_moves(keys, stored)[0].values())
    spread = stats.relative_spread(moves) if len(moves) >= MIN_RELATIVE_RUNS else None
    return max(MIN_SHIFT, noise_k * spread) if spread is not None else MIN_SHIFT


def family_views(verdicts: Sequence[Verdict], stored: StoredRuns | None = None,
                 subfamilies: Mapping[str, str] | None = None) -> list[Family]:
    """Every family of at least ``MIN_CASES`` judged cases: its common move and its relative outliers; then every
    sub-family (``subfamilies``: key -> `ledger.SUBFAMILY` label) of as many, its common move alone."""
    families: dict[tuple[str, str, str], list[Verdict]] = {}
    for v in verdicts:
        if v.change is not None and v.mde is not None and math.isfinite(v.change):
            families.setdefault((v.key.split("::")[0], v.name, ""), []).append(v)
            if (subfamilies or {}).get(v.key):
                families.setdefault((v.key.split("::")[0], v.name, (subfamilies or {})[v.key]), []).append(v)
    views = []
    for (family, name, subfamily), members in sorted(families.items(), key=lambda f: (bool(f[0][2]), f[0])):
        if len(members) < MIN_CASES or (subfamily and len(members) == len(families[(family, name, "")])):
            continue  # too few to tell; or a sub-family that is its whole family (one backend)
        changes = [v.change for v in members if v.change is not None]
        median = stats.median(changes)
        relative_runs = _relative_runs([v.key for v in members], stored or {}) if not subfamily else {}
        first, outliers, thresholds = members[0], [], []
        for v in members:
            assert v.change is not None and v.mde is not None
            runs = relative_runs.get(v.key, [])
            allowed, center = v.mde, 1.0  # without stored runs to learn from: the absolute threshold
            if len(runs) >= MIN_RELATIVE_RUNS:
                spread = stats.relative_spread(runs)
                allowed = max(v.threshold.tolerance, v.threshold.noise_k * (math.inf if spread is None else spread))
                center = stats.median(runs)
                thresholds.append(allowed)
            relative = (1.0 + v.change) / ((1.0 + median) * center) - 1.0
            if not subfamily and v.status is not Status.REGRESSED and _worse(first.better, relative) > allowed:
                outliers.append(Outlier(v.key, v.change, relative, allowed))
        outliers.sort(key=lambda o: _worse(first.better, o.relative) - o.allowed, reverse=True)
        plus, minus = sum(1 for c in changes if c > TIE), sum(1 for c in changes if c < -TIE)
        views.append(Family(family, name, first.unit, first.better, len(members), plus if median > 0 else minus,
                            median, min(changes), max(changes), sign_test_p(plus, minus),
                            stats.median([v.mde for v in members if v.mde is not None]),
                            stats.median(thresholds) if thresholds else None, tuple(outliers),
                            sum(1 for v in members if v.status is Status.IMPROVED),
                            sum(1 for v in members if v.status is Status.REGRESSED), subfamily,
                            common_mde([v.key for v in members], stored or {}, first.threshold.noise_k)))
    return views


def _pct(x: float) -> str:
    return f"{100 * x:+.1f} %"


def _outliers(f: Family) -> str:
    shown = ", ".join(f"{o.key.split('::')[-2]} {_pct(o.relative)} (relative threshold {100 * o.allowed:.1f} %)"
                      for o in f.outliers[:SHOWN_OUTLIERS])
    more = len(f.outliers) - SHOWN_OUTLIERS
    return f"{f.label} {f.name}: {shown}" + (f", and {more} more" if more > 0 else "")


def shift_sections(views: Sequence[Family]) -> list[Section]:
    """The report table of the moved families and the relative outliers of any family: none when neither."""
    moved, leads = [f for f in views if f.moved], [_outliers(f) for f in views if f.outliers]
    if not moved and not leads:
        return []
    rows = tuple((f.label, f.name, f"{f.same_direction} of {f.cases} {f.word}", _pct(f.median_change),
                  f"{_pct(f.low)} .. {_pct(f.high)}", f"{100 * f.median_allowed:.1f} %",
                  "-" if f.median_relative is None else f"{100 * f.median_relative:.1f} %", f"{f.p:.1g}",
                  str(len(f.outliers)), f"{100 * f.common:.1f} %") for f in moved)
    note = ("Every case of the families in the table moved the same way at once (sign test p), which is rarely the "
            "code: the machine runs faster or slower than when its baselines were recorded. A change of a whole "
            "family smaller than its median move cannot be told from the machine's. A relative threshold judges a "
            "case against its family's move, learned from its stored runs with each run's family move divided "
            "out; relative outliers are cases beyond it: leads to look at, not verdicts. On this host's baselines "
            "the verdicts stand (they say 'likely the machine'); against other hosts' baselines a family that moved "
            "as a whole is this host, and its verdicts are INCONCLUSIVE. A move within the family's common mde (what "
            "its stored runs moved together) is divided out of its cases' rounds (cause family). Re-record the "
            "baselines if the machine's new state is the one to guard.")
    if leads:
        note += "\nRelative outliers: " + "; ".join(leads) + "."
    return [Section("Machine shift: whole families moved together" if moved else "Relative outliers",
                    ("family", "metric", "cases", "median change", "range", "median threshold",
                     "median relative threshold", "p", "relative outliers", "common mde"), rows, note)]


def shift_notes(views: Sequence[Family]) -> list[str]:
    """One summary line for the terminal, when a family moved or a case moved against its family."""
    moved = [f for f in views if f.moved]
    outliers = sum(len(f.outliers) for f in views)
    if not moved:
        return [f"moeperf: {outliers} relative outlier(s): see 'Relative outliers' in the report"] if outliers else []
    named = ", ".join(f"{f.label.rsplit('/', 1)[-1]} {f.name} {_pct(f.median_change)} ({f.same_direction} of "
                      f"{f.cases})" for f in moved[:3])
    more = f" and {len(moved) - 3} more" if len(moved) > 3 else ""
    improved, regressed = sum(f.improved for f in moved), sum(f.regressed for f in moved)
    flagged = (f"; {improved} IMPROVED and {regressed} REGRESSED verdicts are in them: look at the machine before "
               "re-recording or bisecting") if improved or regressed else ""
    return [f"moeperf: machine shift: {len(moved)} metric famil{'y' if len(moved) == 1 else 'ies'} moved together "
            f"({named}{more}){flagged}; {outliers} relative outlier(s); see 'Machine shift' in the report"]


#: what must be equal between this run's provenance and a stored update's for the two to run the same code
SAME_CODE_FIELDS = ("software", "driver", "cuda", "env")


def same_code(now: Mapping[str, Any], stored: Mapping[str, Any], runs: Sequence[tuple[str | None, str | None]]
              ) -> bool:
    """Whether a metric's stored runs (each one's commit and code identity; the last update's provenance
    ``stored``) ran the code this run (provenance ``now``) runs: the same software versions, driver, CUDA and perf
    environment (`machine.provenance.perf_environment`; a baseline written before it was kept is not known to
    match), and the same code identity in every run (`machine.provenance.code_identity`: the checkout's files on
    disk less the baselines and the paths ``--moeperf-code-exclude`` names), or, for runs recorded before that was
    kept, one known commit with a clean tree both times."""
    if not runs or not all(f in stored and stored[f] == now.get(f) for f in SAME_CODE_FIELDS):
        return False
    code, commit = now.get("code"), now.get("git_commit")
    if code and all(c == code for _, c in runs):
        return True
    return (bool(commit) and now.get("git_dirty") is False and stored.get("git_dirty") is False
            and all(c == commit for c, _ in runs))


def in_moved_families(verdicts: Mapping[str, Verdict], views: Sequence[Family], same: Collection[str] = (),
                      subfamilies: Mapping[str, str] | None = None) -> dict[str, Verdict]:
    """The IMPROVED and REGRESSED verdicts (by key) inside families that moved as a whole, as they now read: with
    the family's move in the reason; against other hosts' baselines (noise source ``hosts``) INCONCLUSIVE, cause
    ``other-host`` (seen on a fresh 1x H200: every gloo size +21 % against 3 other hosts whose spread allowed
    5-8 %); on this host's runs of this run's code (``same``: keys, `same_code`) INCONCLUSIVE, cause ``machine``,
    a gross change too (the code is the runs' own: whatever moved the whole family is the machine); otherwise a
    gross change (`verdict.gross_factor`) stays decided."""
    changed = {}
    # a sub-family's move first: it is the nearer description of the case's box
    for family in sorted((f for f in views if f.moved), key=lambda f: not f.subfamily):
        label = f"{family.name} [{family.subfamily}]" if family.subfamily else family.name
        note = (f"family {label} moved {family.median_change * 100:+.1f} % ({family.same_direction} of "
                f"{family.cases} cases)")
        for key, v in verdicts.items():
            if (v.status not in (Status.IMPROVED, Status.REGRESSED) or key in changed
                    or not family.holds(key, v.name, (subfamilies or {}).get(key, ""))):
                continue
            if key in same:
                changed[key] = dataclasses.replace(
                    v, status=Status.INCONCLUSIVE, cause=Cause.MACHINE,
                    reason=f"{v.reason}; {note}, and every stored run is of this run's code, software and "
                           "environment: the machine moved, not the code (run again on a settled machine)")
            elif v.cause == Cause.GROSS:  # x3 beyond every run of this host, and the code changed
                changed[key] = dataclasses.replace(v, reason=f"{v.reason}; {note}")
            elif v.noise_source == "hosts":
                changed[key] = dataclasses.replace(
                    v, status=Status.INCONCLUSIVE, cause=Cause.OTHER_HOST,
                    reason=f"baseline from other hosts and its {note}: this host differs from theirs; record one here "
                           "with --moeperf-update (--moeperf-rounds 3 in 2 sittings)")
            else:
                changed[key] = dataclasses.replace(v, reason="; ".join([*([v.reason] if v.reason else []),
                                                                        f"{note}: {LIKELY_THE_MACHINE}"]))
    return changed


def _round_changes(v: Verdict, common: float) -> list[float]:
    """Each round median of ``v`` against its reference with a common relative move ``common`` divided out, as a
    signed relative change that is positive when worse."""
    assert v.reference
    return [_worse(v.better, m / (v.reference * (1.0 + common)) - 1.0) for m in v.round_medians]


def awaits_family(v: Verdict, common: float = MIN_SHIFT) -> bool:
    """Whether a REGRESSED could still be its family's common move within ``common`` (`common_mde`, at least
    ``MIN_SHIFT``; `beside_common_moves`): not a gross change, and its least-worse round is within its mde once that
    move is divided out. Such a verdict waits for the session's end in a family of ``MIN_CASES`` or more tests; a
    larger change fails its test at once."""
    if v.status is not Status.REGRESSED or v.cause == Cause.GROSS or not v.reference or v.mde is None:
        return False
    move = _worse(v.better, max(common, MIN_SHIFT))
    return bool(v.round_medians) and min(_round_changes(v, move)) <= v.mde


def beside_common_moves(verdicts: Mapping[str, Verdict], views: Sequence[Family],
                        subfamilies: Mapping[str, str] | None = None) -> dict[str, Verdict]:
    """The IMPROVED and REGRESSED verdicts (by key, not gross) whose nearest family that moved together (its
    sub-family first) moved by less than its common mde (`Family.together`), as they now read: judged on each round
    median with the family's move divided out, INCONCLUSIVE (cause ``family``) unless every round is still beyond
    the mde. A case whose nearest such family moved by more is `in_moved_families`' alone to judge."""
    changed = {}
    nearest_first = sorted((f for f in views if f.p < ALPHA), key=lambda f: not f.subfamily)
    for key, v in verdicts.items():
        if (v.status not in (Status.IMPROVED, Status.REGRESSED) or v.cause == Cause.GROSS or not v.reference
                or v.mde is None or not v.round_medians):
            continue
        family = next((f for f in nearest_first if f.holds(key, v.name, (subfamilies or {}).get(key, ""))), None)
        if family is None or not family.together:
            continue
        rounds = _round_changes(v, family.median_change)
        sign = 1.0 if v.status is Status.REGRESSED else -1.0
        beyond = sum(1 for r in rounds if r * sign > v.mde)
        label = f"{family.name} [{family.subfamily}]" if family.subfamily else family.name
        note = (f"family {label} {FAMILY_NOTE} ({_pct(family.median_change)}, {family.same_direction} of "
                f"{family.cases} cases, sign test p = {family.p:.2g}; its common mde is {100 * family.common:.1f} %): "
                f"with that move divided out, its round medians read {', '.join(_pct(r) for r in rounds)}")
        if beyond == len(rounds):
            changed[key] = dataclasses.replace(v, reason=f"{v.reason}; {note}, all beyond the mde: decided")
        else:
            changed[key] = dataclasses.replace(
                v, status=Status.INCONCLUSIVE, cause=Cause.FAMILY,
                reason=f"{v.reason}; {note}: {beyond} of {len(rounds)} beyond the mde {100 * v.mde:.1f} %, so this "
                       "case is not told apart from its family's common move, the machine's or the code's")
    return changed


def awaited_lines(failing: Sequence[Verdict], verdicts: Sequence[Verdict], common: Callable[[str], float]
                  ) -> list[str]:
    """The session's end: the REGRESSED verdicts that fail it (``failing``) whose tests waited for it
    (`awaits_family`, with ``common`` giving a key's family's common mde, in a family of ``MIN_CASES`` or more judged
    cases), each with its message."""
    sizes = Counter((v.key.split("::")[0], v.name) for v in verdicts)
    waited = [v for v in failing if not v.provisional and sizes[(v.key.split("::")[0], v.name)] >= MIN_CASES
              and awaits_family(v, common(v.key))]
    if not waited:
        return []
    return [f"moeperf: {len(waited)} metric(s) REGRESSED, decided at the session's end (a common move of their family "
            "that its stored runs show could have explained them; their tests waited for it): the session fails",
            *(f"  {v.key.rsplit('::', 1)[0]}::{v.message()}" for v in waited)]
