"""The machine judge of a session: the canary's readings in the ledger against its figures in the store, through the
pure rule of `judging.machine`. It reads; the ledger's verdicts it reads again are decided at the session's end
(`conclude`); a test's REGRESSED waits for that end while the canary beside it moved slower (`slower`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from pytest_moeperf.judging import machine
from pytest_moeperf.judging.verdict import Verdict
from pytest_moeperf.ledger import SUBFAMILY, Ledger
from pytest_moeperf.machine.canary import Canary, Reading
from pytest_moeperf.store.baselines import BaselineStore


@dataclass
class MachineJudge:
    store: BaselineStore
    ledger: Ledger
    canary: Canary | None = None  # this process's canary (`machine.canary_plugin`), when it is read
    moves: list[machine.CanaryMove] = field(default_factory=list)  # against the stored figures, at the end
    flagged: set[str] = field(default_factory=set)  # tests the canary was read beside (a REGRESSED at their call)

    def subfamilies(self) -> dict[str, str]:
        """Each record's sub-family (`ledger.SUBFAMILY`; "" when its test names none)."""
        return {k: str(r.metric.context.get(SUBFAMILY) or "") for k, r in self.ledger.records.items()}

    def _stored(self, keys: set[str]) -> tuple[dict[str, tuple[float, ...]], set[str]]:
        """The canary's stored figures by key: this host's, or, while it has fewer than `machine.MIN_FIGURES`, every
        other host's (a fresh CI machine judged against baselines recorded elsewhere: a machine unlike the one that
        recorded is what the canary is there to see); and the keys whose figures are other hosts'."""
        mine, others = self.store.host_medians(keys), self.store.host_medians(keys, others=True)
        borrowed = {k for k in keys if len(mine.get(k, ())) < machine.MIN_FIGURES and others.get(k)}
        return {k: others[k] if k in borrowed else mine.get(k, ()) for k in keys}, borrowed

    def _moves(self, readings: list[Reading]) -> list[machine.CanaryMove]:
        stored, borrowed = self._stored({r.key for r in readings})
        return machine.canary_moves(readings, stored, borrowed)

    def slower(self, key: str) -> bool:
        """Whether the canary beside ``key``'s test file, read again beside its test, moved slower than its stored
        figures: then whether the machine explains the regression is decided at the session's end."""
        file, test, canary = key.split("::", 1)[0], key.rsplit("::", 1)[0], self.canary
        if canary is None:
            return False
        if not any(self._stored({r.key for r in self.ledger.canary + canary.pending if r.file == file})[0]
                   .values()):
            return False  # nothing to compare with: the canary is not read for nothing
        if test not in self.flagged:
            self.flagged.add(test)
            canary.read(file, "flagged")
        moves = self._moves([r for r in self.ledger.canary + canary.pending if r.file == file])
        return machine.moved_slower(moves, file) is not None

    def conclude(self) -> None:
        """The session's end: the canary's moves, the verdicts its move explains read again, its report table."""
        self.moves = self._moves(self.ledger.canary)
        verdicts = {k: r.verdict for k, r in self.ledger.records.items() if r.verdict is not None}
        changed, matches = machine.machine_verdicts(verdicts, self.subfamilies(), self.moves)
        for key, verdict in changed.items():
            self.ledger.decide(key, verdict)
        self.ledger.sections += machine.machine_section(self.moves, matches)
        self.ledger.notes += machine.machine_notes(self.moves, matches)

    def report_entries(self) -> list[Verdict]:
        """The canary's figures, in the shape of verdicts, for the JSON report and the history (its series)."""
        return machine.canary_verdicts(self.moves)

    @staticmethod
    def beside(verdicts: list[Verdict]) -> list[Verdict]:
        """The REGRESSED verdicts that stand beside a canary that moved."""
        return [v for v in verdicts if machine.MACHINE_MOVED in v.reason]
