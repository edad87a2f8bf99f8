"""The requests a window sends: seeded random-token prompts of exact lengths, or prompts drawn from a file."""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from pathlib import Path

from pytest_moeperf.serving.loadgen import Request

__all__ = ["prompt_set_requests", "random_token_requests"]


def random_token_requests(
    count: int,
    input_len: int,
    output_len: int,
    *,
    token_range: tuple[int, int] | None = None,
    vocabulary: Sequence[int] = (),
    seed: int = 0,
) -> list[Request]:
    """Prompts of exactly ``input_len`` uniformly random token ids, drawn from ``token_range`` (half-open) or
    from ``vocabulary`` (ids known to be valid), with ``ignore_eos`` so every request generates exactly
    ``output_len`` tokens."""
    if vocabulary:
        pool: Sequence[int] = tuple(vocabulary)
    elif token_range is not None and 0 <= token_range[0] < token_range[1]:
        pool = range(*token_range)
    else:
        raise ValueError(f"need a vocabulary or a token_range with 0 <= low < high, got {token_range}")
    rng = random.Random(seed)
    return [
        Request(
            prompt=tuple(rng.choice(pool) for _ in range(input_len)),
            max_tokens=output_len,
            prompt_tokens=input_len,
        )
        for _ in range(count)
    ]


def prompt_set_requests(path: Path, count: int, output_len: int, *, seed: int = 0) -> list[Request]:
    """``count`` prompts drawn from a JSON list of strings (a seeded shuffle, cycled), ``ignore_eos``."""
    prompts = json.loads(path.read_text())
    if not isinstance(prompts, list) or not prompts or not all(isinstance(p, str) for p in prompts):
        raise ValueError(f"{path}: expected a non-empty JSON list of strings")
    order = list(prompts)
    random.Random(seed).shuffle(order)
    return [Request(prompt=order[i % len(order)], max_tokens=output_len) for i in range(count)]
