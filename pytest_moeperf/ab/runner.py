"""The A/B runner: randomized ABBA blocks of separate pytest processes, one producer of the ledger.

A block is four processes, ``base head head base`` or ``head base base head`` (the order drawn at random, seeded),
so a drift of the box during the block weighs on both sides alike; its halves are two pairs. Every process is a
child pytest session (`processes.children.run_child`) of the same pytest arguments in its side's checkout, with
its side's interpreter and environment, as a rounds child (``MOEPERF_ROUND``: no confirmation re-runs, no baseline,
no Markdown), with ``--moeperf-history off`` and an empty baselines directory (its metrics are judged against the
other side, not against stored runs). Its ledger comes back through its JSON report, its rounds labelled
``base k`` / ``head k``. A block can run only some tests (``MOEPERF_ONLY``): the extra pairs of unsettled metrics.
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_moeperf.ab.sides import BASE, HEAD, Side
from pytest_moeperf.ab.verdicts import MetricPairs, Pair, observation
from pytest_moeperf.ledger import Ledger
from pytest_moeperf.processes.children import ONLY_ENV, ChildResult, only_file, run_child
from pytest_moeperf.settings import ROUND_ENV

#: pytest exit codes of a child that measured (1: some test failed, its metrics still count)
MEASURED = (0, 1)
#: pytest exit codes that mean the pytest arguments are wrong (usage error, no tests collected)
BAD_ARGUMENTS = (4, 5)


class SideFailed(Exception):
    """A child session ended without a usable report (crashed, interrupted, or the pytest arguments are wrong)."""

    def __init__(self, label: str, result: ChildResult) -> None:
        self.label = label
        self.result = result
        self.bad_arguments = result.returncode in BAD_ARGUMENTS
        problem = f" and {result.problem}" if result.problem and result.returncode in MEASURED else ""
        super().__init__(f"{label} ended with exit code {result.returncode}{problem}")


@dataclass(frozen=True)
class Process:
    """One child session of one side: the ``number``-th of its side, in pair ``pair`` of block ``block``."""

    side: str
    number: int
    pair: int
    block: int
    ledger: Ledger
    document: Mapping[str, Any] | None
    failures: tuple[str, ...]
    seconds: float

    @property
    def label(self) -> str:
        return f"{self.side} {self.number}"


def block_orders(rng: random.Random, pairs: int) -> list[tuple[str, str]]:
    """The pairs of one block, each (first, second): ABBA or BAAB drawn at random (one pair: AB or BA)."""
    first = (BASE, HEAD) if rng.random() < 0.5 else (HEAD, BASE)
    return [first, (first[1], first[0])][:pairs]


def relabel(ledger: Ledger, origin: str) -> Ledger:
    """The child's rounds named for the process (a side's child runs one round of each test)."""
    for key, record in list(ledger.records.items()):
        rounds = tuple(dataclasses.replace(r, origin=origin) for r in record.rounds)
        ledger.records[key] = dataclasses.replace(record, rounds=rounds)
    return ledger


class Runner:
    """Runs blocks; keeps every process it ran, in order."""

    def __init__(self, sides: Mapping[str, Side], args: Sequence[str], baselines: Path, scratch: Path, seed: int,
                 echo: Callable[[str], None], progress: bool = True,
                 side_args: Mapping[str, Sequence[str]] | None = None,
                 before: Callable[[str, bool, bool], Mapping[str, Sequence[str]]] | None = None) -> None:
        self.sides = sides
        # joined with '=': a separate existing path would move pytest's rootdir (and the node ids it prints)
        self.args = [*args, "--moeperf-history=off", f"--moeperf-baselines={baselines}"]
        self.side_args = side_args or {}  # each side's own pytest arguments (its server: `ab.servers`)
        #: run before every process: (side, it opens its pair, the pair is the run's first) -> the sides' arguments
        self.before = before
        self.scratch = scratch
        self.rng = random.Random(seed)
        self.echo = echo
        self.progress = progress  # echo the children's own progress lines
        self.processes: list[Process] = []
        self.pairs = 0
        self.blocks = 0
        self.counts = {BASE: 0, HEAD: 0}

    def block(self, pairs: int, only: Sequence[str] = ()) -> None:
        """One block of ``pairs`` (1 or 2) pairs; ``only``: the tests it runs (empty: all the arguments select)."""
        orders = block_orders(self.rng, pairs)
        self.blocks += 1
        which = f", {len(only)} test(s)" if only else ""
        self.echo(f"moeperf ab: block {self.blocks} ({' '.join(s for order in orders for s in order)}{which})")
        for order in orders:
            first_pair = not self.pairs
            self.pairs += 1
            for i, side in enumerate(order):
                if self.before is not None:
                    self.side_args = self.before(side, i == 0, first_pair)
                self._run(side, only)

    def _run(self, name: str, only: Sequence[str]) -> None:
        side = self.sides[name]
        self.counts[name] += 1
        label = f"{name} {self.counts[name]}"
        extra = {ROUND_ENV: f"ab {label}"}
        if only:
            extra[ONLY_ENV] = str(only_file(self.scratch, only))
        started = time.monotonic()
        done = run_child([*self.args, *self.side_args.get(name, ())], side.cwd, side.environ(extra), side.python,
                         echo=self.echo if self.progress else None, scratch=self.scratch)
        seconds = time.monotonic() - started
        line = f"  {label} ({seconds:.1f} s): {done.last_line}"
        if done.returncode not in MEASURED or done.ledger is None:
            self.echo(line)
            raise SideFailed(label, done)
        # kept before it is announced: a Ctrl-C right after the line must not lose the process it names
        self.processes.append(Process(name, self.counts[name], self.pairs, self.blocks,
                                      relabel(done.ledger, label), done.document, tuple(done.failures), seconds))
        self.echo(line)

    def keep_complete_pairs(self) -> int:
        """After an interruption: drop the processes of a pair whose other side never finished; the pairs left."""
        sides: dict[int, set[str]] = {}
        for process in self.processes:
            sides.setdefault(process.pair, set()).add(process.side)
        complete = {pair for pair, done in sides.items() if done == {BASE, HEAD}}
        self.processes = [p for p in self.processes if p.pair in complete]
        self.pairs = len(complete)
        return self.pairs

    def first_document(self, side: str) -> Mapping[str, Any] | None:
        return next((p.document for p in self.processes if p.side == side and p.document), None)


def metric_pairs(processes: Sequence[Process]) -> list[MetricPairs]:
    """Every metric the processes recorded (in the order first seen) with its pairs: per pair, what the base and
    the head process measured of it (a pair that ran neither side's test of it is left out)."""
    metrics: dict[str, MetricPairs] = {}
    by_pair: dict[int, dict[str, Process]] = {}
    for process in processes:
        by_pair.setdefault(process.pair, {})[process.side] = process
        for key, record in process.ledger.records.items():
            found = metrics.setdefault(key, MetricPairs(key))
            if process.side == BASE and found.base is None:
                found.base = record
            elif process.side == HEAD and found.head is None:
                found.head = record
    for number in sorted(by_pair):
        sides = by_pair[number]
        for key, found in metrics.items():
            base = sides[BASE].ledger.records.get(key) if BASE in sides else None
            head = sides[HEAD].ledger.records.get(key) if HEAD in sides else None
            if base is not None or head is not None:
                found.pairs.append(Pair(number, None if base is None else observation(base),
                                        None if head is None else observation(head)))
    return list(metrics.values())


def merged(processes: Sequence[Process]) -> Ledger:
    """The run's ledger: every process's records, their rounds in the order run (``base k`` / ``head k``), the
    tests and warnings; the children's extra tables are left out (each process has its own numbers)."""
    ledger = Ledger()
    for process in processes:
        ledger.merge(Ledger(records=process.ledger.records, tests=process.ledger.tests,
                            warnings=process.ledger.warnings))
    return ledger
