"""Pure speculative-decoding arithmetic: vLLM's spec-decode counters over a window, and the draft table.

Over a window (counter deltas between two scrapes of ``/metrics``): acceptance rate = accepted / draft tokens;
mean acceptance length = 1 + accepted / drafts (tokens emitted per target forward pass); per-position
acceptance = accepted at position i / drafts. Speedup = TPOT without speculation / TPOT with it, for the same
model, build and workload. A profile that pins its acceptance (`pytest_moeperf.serving.models.acceptance`) must
measure it: `pinned_miss` says when a window's acceptance length is not the pinned one (the knob did not take).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pytest_moeperf.serving.analysis.prometheus import Scrape

__all__ = [
    "AcceptanceStats",
    "CandidateRow",
    "SpecDecodeCounters",
    "acceptance",
    "comparison_table",
    "pinned_miss",
    "speedup",
]

#: how far a window's mean acceptance length may be from the one its profile pins, relative. vLLM draws each accept
#: decision, so a window's own spread is binomial: at 2.88 with k = 3 (rates 1, 0.88, 0) a draft accepts 1.88 +- 0.32
#: tokens, so the ~500 drafts of a GPU c=1 window give +- 0.5 % (1 sigma); on 1x H200 (vLLM 0.26) 2.88 read
#: 2.876-2.902 and 1.83 read 1.827-1.830 over 1.4k-11k drafts (../shared/FACTS.md)
PINNED_TOLERANCE = 0.02

DRAFTS = "vllm:spec_decode_num_drafts_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"


@dataclass(frozen=True)
class SpecDecodeCounters:
    """The cumulative spec-decode counters of one scrape, summed over engines."""

    drafts: float
    draft_tokens: float
    accepted: float
    accepted_per_pos: tuple[float, ...]

    @classmethod
    def from_scrape(cls, scrape: Scrape) -> SpecDecodeCounters | None:
        """None when the server exposes no spec-decode counters (it runs without speculation)."""
        drafts = scrape.total(DRAFTS)
        if drafts is None:
            return None
        by_pos: dict[int, float] = {}
        for sample in scrape.select(ACCEPTED_PER_POS):
            pos = int(sample.label_map["position"])
            by_pos[pos] = by_pos.get(pos, 0.0) + sample.value
        per_pos = tuple(by_pos.get(i, 0.0) for i in range(max(by_pos) + 1)) if by_pos else ()
        return cls(
            drafts=drafts,
            draft_tokens=scrape.total(DRAFT_TOKENS) or 0.0,
            accepted=scrape.total(ACCEPTED) or 0.0,
            accepted_per_pos=per_pos,
        )

    def minus(self, before: SpecDecodeCounters) -> SpecDecodeCounters:
        """Counter deltas over a window; a counter that went down means the server restarted."""
        width = max(len(self.accepted_per_pos), len(before.accepted_per_pos))
        pad_after = self.accepted_per_pos + (0.0,) * (width - len(self.accepted_per_pos))
        pad_before = before.accepted_per_pos + (0.0,) * (width - len(before.accepted_per_pos))
        delta = SpecDecodeCounters(
            drafts=self.drafts - before.drafts,
            draft_tokens=self.draft_tokens - before.draft_tokens,
            accepted=self.accepted - before.accepted,
            accepted_per_pos=tuple(a - b for a, b in zip(pad_after, pad_before, strict=True)),
        )
        if min((delta.drafts, delta.draft_tokens, delta.accepted, *delta.accepted_per_pos)) < 0:
            raise ValueError("spec-decode counters went down between scrapes: the server restarted mid-window")
        return delta


@dataclass(frozen=True)
class AcceptanceStats:
    drafts: float
    draft_tokens: float
    accepted: float
    acceptance_rate: float
    mean_acceptance_length: float
    per_position: tuple[float, ...]


def acceptance(before: SpecDecodeCounters, after: SpecDecodeCounters) -> AcceptanceStats:
    """Acceptance figures of the window between two scrapes. Raises if no draft was proposed in it."""
    d = after.minus(before)
    if d.drafts <= 0 or d.draft_tokens <= 0:
        raise ValueError("no speculative drafts in the window: nothing to compute acceptance from")
    return AcceptanceStats(
        drafts=d.drafts,
        draft_tokens=d.draft_tokens,
        accepted=d.accepted,
        acceptance_rate=d.accepted / d.draft_tokens,
        mean_acceptance_length=1.0 + d.accepted / d.drafts,
        per_position=tuple(a / d.drafts for a in d.accepted_per_pos),
    )


def pinned_miss(pinned: float, tokens: int, stats: AcceptanceStats, tolerance: float = PINNED_TOLERANCE) -> str | None:
    """Why the window's acceptance length from ``/metrics`` is not the ``pinned`` one of a ``tokens``-token drafter
    (None: it is, within ``tolerance``). Every draft of k tokens expects exactly the pinned length; a drafter that
    proposed fewer (n-gram, near the end of its match) expects less, down to 1 + (mean draft / k) (pinned - 1) (the
    pinned rates do not increase with the position, so the first m positions hold at least m / k of them)."""
    mean_draft = stats.draft_tokens / stats.drafts if stats.drafts else 0.0
    low = 1.0 + min(1.0, mean_draft / tokens) * (pinned - 1.0) if tokens > 0 else pinned
    measured = stats.mean_acceptance_length
    if low * (1.0 - tolerance) <= measured <= pinned * (1.0 + tolerance):
        return None
    expected = f"{pinned:g}" if low >= pinned - 1e-9 else (
        f"{low:.3f} to {pinned:g} (drafts of {mean_draft:.2f} tokens on average, of {tokens})")
    return (f"the pinned acceptance did not take: the window measured an acceptance length of {measured:.3f} from "
            f"/metrics over {stats.drafts:.0f} drafts, where its profile pins {pinned:g} (expected {expected}, "
            f"+-{tolerance:.0%}): this window measured another acceptance, not the pinned one")


def speedup(tpot_without_ms: float, tpot_with_ms: float) -> float:
    if tpot_without_ms <= 0 or tpot_with_ms <= 0:
        raise ValueError(f"TPOTs must be > 0, got {tpot_without_ms} and {tpot_with_ms}")
    return tpot_without_ms / tpot_with_ms


@dataclass(frozen=True)
class CandidateRow:
    """One draft candidate at one concurrency, as measured in a run."""

    profile: str
    method: str
    concurrency: int
    tpot_ms: float
    output_throughput: float
    acceptance_length: float | None = None
    acceptance_rate: float | None = None
    speedup: float | None = None


COLUMNS: tuple[str, ...] = (
    "profile",
    "method",
    "concurrency",
    "accept len",
    "accept rate",
    "TPOT ms",
    "output tok/s",
    "speedup",
)


def comparison_table(rows: Sequence[CandidateRow]) -> tuple[tuple[str, ...], list[tuple[str, ...]]]:
    """Columns and formatted rows, ordered by concurrency then by speedup (best first)."""

    def key(r: CandidateRow) -> tuple[int, float, str]:
        return (r.concurrency, -(r.speedup if r.speedup is not None else 1.0), r.profile)

    def opt(value: float | None, fmt: str) -> str:
        return "-" if value is None else format(value, fmt)

    out: list[tuple[str, ...]] = [
        (
            r.profile,
            r.method,
            str(r.concurrency),
            opt(r.acceptance_length, ".2f"),
            opt(r.acceptance_rate, ".1%"),
            f"{r.tpot_ms:.2f}",
            f"{r.output_throughput:.1f}",
            opt(r.speedup, ".2f") + ("x" if r.speedup is not None else ""),
        )
        for r in sorted(rows, key=key)
    ]
    return COLUMNS, out
