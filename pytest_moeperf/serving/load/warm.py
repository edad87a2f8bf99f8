"""Warm windows: before a measured window, an unmeasured pass that brings the server to the batch shapes the window
will run.

Seen on 1x H200 (vLLM 0.26, tiny MoE, two server starts two minutes apart): the first window at each new
concurrency met Triton's just-in-time compiles of new batch shapes ("Triton kernel JIT compilation during
inference"): c=16 TTFT 745 ms against 35 ms warm, c=16 and c=64 throughput 38-39 % apart; a few warm-up requests do
not reach the batch sizes a window at concurrency C runs. So the warm pass has the window's own shape: the same
load shape (concurrency, or rate and burstiness), the same endpoint and the same prompt and output lengths, on
other prompts than the window's (a repeated prompt would hit vLLM's prefix cache and shorten the window's prefills).

Its size (`warm_count`): a closed loop at concurrency C runs ``max(floor, 2 C)`` requests (C prefills together,
a full batch of C decodes, the drain, then the next wave); an open loop a quarter of the window (at least
``floor``). A server that has already run a pass of the same shape (`shape_key`) since it started is warm for it:
its later windows (a confirmation re-run, the speedup's rounds after the decode windows) run none. What the pass
cost (requests, seconds) goes into the test's context; `pytest_moeperf.serving.analysis.drift` checks whether it
was enough.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from pytest_moeperf.ledger import JSONScalar
from pytest_moeperf.serving.load.loadgen import ClosedLoop, Endpoint, LoadShape, Request

__all__ = ["ALREADY_WARM", "NOT_ASKED", "ShapeKey", "WarmPass", "shape_key", "warm_count"]

ShapeKey = tuple[str, str, tuple[tuple[str, int, int], ...]]


def warm_count(shape: LoadShape, window: int, floor: int = 1) -> int:
    """Requests of the unmeasured pass before a window of ``window`` requests under ``shape``."""
    if isinstance(shape, ClosedLoop):
        return max(floor, 2 * shape.concurrency)
    return max(floor, math.ceil(window / 4))


def shape_key(requests: Sequence[Request], shape: LoadShape, endpoint: Endpoint) -> ShapeKey:
    """What makes two windows run the same batch shapes: endpoint, load shape and the requests' kinds and lengths
    (token-id prompts by their length; text prompts as text, their lengths set by the tokenizer)."""
    kinds = sorted({("text", 0, r.max_tokens) if isinstance(r.prompt, str) else ("ids", len(r.prompt), r.max_tokens)
                    for r in requests})
    return endpoint.value, shape.label, tuple(kinds)


ALREADY_WARM = "none: this server already ran a pass of this shape (an earlier window, or an earlier round)"
NOT_ASKED = "none asked for"


@dataclass(frozen=True)
class WarmPass:
    """The unmeasured pass before a window: how many requests it sent, how many failed, how long it took; with no
    requests, why there was none (``note``)."""

    requests: int
    seconds: float = 0.0
    failed: int = 0
    note: str = ""
    passes: int = 1  # repeated while the server compiled kernels during it (`pytest_moeperf.serving.analysis.jit`)
    compiles: int | None = None  # the kernel compiles the server logged during the passes (None: no log read)

    def context(self) -> dict[str, JSONScalar]:
        facts: dict[str, JSONScalar] = {"warm_requests": self.requests, "warm_s": round(self.seconds, 3),
                                        "warm_failed": self.failed}
        if self.requests:
            facts.update(warm_passes=self.passes, warm_compiles=self.compiles)
        else:
            facts["warm"] = self.note or NOT_ASKED
        return facts
