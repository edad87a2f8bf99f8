"""Records: what a test measured (`Measurement`) and extra report tables (`Section`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

Better = Literal["lower", "higher"]
JSONScalar = str | int | float | bool | None


@dataclass(frozen=True)
class Measurement:
    """One metric of one test: its samples and how to judge them.

    ``key`` (``<nodeid>::<name>``) identifies the metric in a baseline file.
    """

    test_id: str
    name: str
    samples: tuple[float, ...]
    unit: str
    better: Better
    tolerance: float | None = None
    abs_tolerance: float | None = None
    context: Mapping[str, JSONScalar] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.name or "::" in self.name:
            raise ValueError(f"metric name must be non-empty and contain no '::', got {self.name!r}")
        if not self.samples:
            raise ValueError(f"metric {self.name!r}: no samples")
        if self.better not in ("lower", "higher"):
            raise ValueError(f"metric {self.name!r}: better must be 'lower' or 'higher', got {self.better!r}")
        for sample in self.samples:
            if sample != sample or sample in (float("inf"), float("-inf")):
                raise ValueError(f"metric {self.name!r}: sample {sample} is not a finite number")
        for name, tol in (("tolerance", self.tolerance), ("abs_tolerance", self.abs_tolerance)):
            if tol is not None and tol < 0:
                raise ValueError(f"metric {self.name!r}: {name} must be >= 0, got {tol}")

    @property
    def key(self) -> str:
        return f"{self.test_id}::{self.name}"

    def to_json(self) -> dict[str, Any]:
        return {"test_id": self.test_id, "name": self.name, "samples": list(self.samples), "unit": self.unit,
                "better": self.better, "tolerance": self.tolerance, "abs_tolerance": self.abs_tolerance,
                "context": dict(self.context)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Measurement:
        return cls(test_id=data["test_id"], name=data["name"], samples=tuple(data["samples"]), unit=data["unit"],
                   better=data["better"], tolerance=data.get("tolerance"), abs_tolerance=data.get("abs_tolerance"),
                   context=dict(data.get("context", {})))

    @property
    def suite(self) -> str:
        return suite_of(self.test_id)


def suite_of(test_id: str) -> str:
    """The test file's stem (``suites/gemm/test_gemm.py::…`` → ``test_gemm``): the baseline file name."""
    path = test_id.split("::", 1)[0]
    stem = path.rsplit("/", 1)[-1]
    return stem[:-3] if stem.endswith(".py") else stem


def as_samples(samples: float | int | Sequence[float | int]) -> tuple[float, ...]:
    if isinstance(samples, (int, float)):
        return (float(samples),)
    return tuple(float(s) for s in samples)


@dataclass(frozen=True)
class Section:
    """An extra table in the reports (e.g. the decode-step budget, the draft-model comparison)."""

    title: str
    columns: tuple[str, ...]
    rows: tuple[tuple[Any, ...], ...]
    note: str = ""
