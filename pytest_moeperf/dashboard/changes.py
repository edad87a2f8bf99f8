"""The change points of many series at once: the history's own detector (`history.trend.find_steps`, Apache Otava's
E-divisive), spread over worker processes. One series of 50 points takes Otava about 20 ms; a dashboard of 1,000
metrics on 2 hosts has 2,000 of them, hence the pool (``jobs``; 1 runs them here)."""

from __future__ import annotations

import os
from collections.abc import Hashable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import TypeVar

from pytest_moeperf.history.trend import MAX_PVALUE, MIN_MAGNITUDE, WINDOW, Step, find_steps

K = TypeVar("K", bound=Hashable)
SERIAL_BELOW = 64  # fewer series than this: a pool costs more than it saves


def default_jobs() -> int:
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)


def _steps_of(batch: Sequence[Sequence[float]], max_pvalue: float, min_magnitude: float,
              window: int) -> list[list[Step]]:
    return [find_steps(values, max_pvalue, min_magnitude, window) for values in batch]


def all_steps(series: Mapping[K, Sequence[float]], jobs: int = 1, max_pvalue: float = MAX_PVALUE,
              min_magnitude: float = MIN_MAGNITUDE, window: int = WINDOW) -> dict[K, list[Step]]:
    """Each series' change points (indices into it), keyed as given; series of fewer than 3 values have none."""
    keys = [k for k, values in series.items() if len(values) >= 3]
    found: dict[K, list[Step]] = {k: [] for k in series}
    if jobs <= 1 or len(keys) < SERIAL_BELOW:
        for key, steps in zip(keys, _steps_of([series[k] for k in keys], max_pvalue, min_magnitude, window),
                              strict=True):
            found[key] = steps
        return found
    import otava.analysis  # noqa: F401 - once here: the forked workers inherit it instead of each importing scipy

    size = max(1, len(keys) // (jobs * 8))  # a few batches per worker: even out, little pickling
    batches = [keys[i:i + size] for i in range(0, len(keys), size)]
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        futures = [pool.submit(_steps_of, [list(series[k]) for k in batch], max_pvalue, min_magnitude, window)
                   for batch in batches]
        for batch, future in zip(batches, futures, strict=True):
            for key, steps in zip(batch, future.result(), strict=True):
                found[key] = steps
    return found
