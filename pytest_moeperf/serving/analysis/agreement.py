"""Client against server over the same plateau: one statistic per name, and which side moved when they part.

Client and server figures that share a name are the same statistic. The server's are means (vLLM's histograms give
a sum and a count: `arbiter`), named ``engine_*_mean_ms``; beside them the client's means over the plateau's requests,
``ttft_mean_ms``, ``tpot_mean_ms`` (``e2el_mean_ms``, ``itl_mean_ms``). The client's medians (``ttft_ms``,
``tpot_ms``, ``e2el_ms``) have no server twin: a histogram's buckets (vLLM's TPOT buckets start at 10 ms) cannot
give a median of millisecond TPOTs. Before, a client median was set against a server mean: 0.915-1.044 on 1x H200.

Every window reports client mean / server mean of TPOT and TTFT in its context (``tpot_client_server``,
``ttft_client_server``). The client's TPOT adds only the difference of two delivery delays spread over the tokens, so
on a GPU box the two should agree within `AGREE` (±3 %); its TTFT adds the request's HTTP parsing and the first
chunk's delivery, so a steady offset there is the client's path, not a fault. A window whose ratio leaves ±3 % says
so (``client_server``), and the report's table says which side moved: the one whose mean moved more against its own
baseline (where both have one).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pytest_moeperf.judging import stats
from pytest_moeperf.ledger import JSONScalar
from pytest_moeperf.serving.analysis.arbiter import EngineFigures
from pytest_moeperf.serving.analysis.metrics import RequestOutcome, latency_samples

__all__ = ["AGREE", "PAIRS", "Agreement", "agreements", "facts", "which_moved"]

AGREE = 0.03
#: latency -> (the client's mean metric, the server's mean metric)
PAIRS = {"tpot": ("tpot_mean_ms", "engine_tpot_mean_ms"), "ttft": ("ttft_mean_ms", "engine_ttft_mean_ms")}


@dataclass(frozen=True)
class Agreement:
    """One latency's client mean and server mean over a window's plateau."""

    metric: str
    client_ms: float
    server_ms: float

    @property
    def ratio(self) -> float:
        return self.client_ms / self.server_ms

    @property
    def outside(self) -> bool:
        return abs(self.ratio - 1.0) > AGREE

    def describe(self) -> str:
        return f"{self.metric.upper()} client mean / server mean {self.ratio:.3f}, outside ±{AGREE * 100:g} %"


def agreements(outcomes: Sequence[RequestOutcome], engine: EngineFigures) -> list[Agreement]:
    """TPOT and TTFT: the client's mean over ``outcomes`` (the plateau) against the server's, where both exist."""
    samples = latency_samples(outcomes)
    found = []
    for metric, server in (("tpot", engine.tpot_ms), ("ttft", engine.ttft_ms)):
        if samples[metric] and server:
            found.append(Agreement(metric, stats.mean(samples[metric]), server))
    return found


def facts(found: Sequence[Agreement]) -> dict[str, JSONScalar]:
    """The window's context: each ratio, and what left ±3 % (None: nothing did)."""
    out: dict[str, JSONScalar] = {f"{a.metric}_client_server": round(a.ratio, 4) for a in found}
    outside = [a.describe() for a in found if a.outside]
    out["client_server"] = "; ".join(outside) or None
    return out


def which_moved(ratio: float, client_change: float | None, server_change: float | None) -> str:
    """Which side moved, when the client/server ratio left ±3 %: the one whose mean changed more against its own
    baseline (changes relative, signed)."""
    if abs(ratio - 1.0) <= AGREE:
        return "agree"
    if client_change is None or server_change is None:
        return "no baseline of both: cannot tell which moved"
    side = "client" if abs(client_change) > abs(server_change) else "server"
    return (f"{side} moved (client {client_change * 100:+.1f} %, server {server_change * 100:+.1f} % against their "
            "baselines)")


def ratio_of(values: Mapping[str, float | None], metric: str) -> float | None:
    """Client mean / server mean of ``metric`` from metric values by name (None: one is missing)."""
    client, server = (values.get(name) for name in PAIRS[metric])
    return None if client is None or not server else client / server
