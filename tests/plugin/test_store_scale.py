"""What a large baseline file costs (issue 37, item 18): a session pays for the metrics it uses, not for the file.

A file of 100,000 metrics (170 MB) took 7.9 s and 650 MB to judge and 24.6 s and 1.8 GB to update: every metric was
made into objects on read, and an update encoded every one again with the standard library's pure-Python indented
encoder. Now every metric is checked on read and made only when used, and an update encodes only the metrics it
measured, writing the others back as read. The figures are a benchmark's, not a test's
(``tests/benchmarks/baseline_scale.py``, ``docs/measurements/baseline-scale.md``); these tests count the work.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_moeperf.ledger import Measurement
from pytest_moeperf.store import baselines
from pytest_moeperf.store.baselines import BaselineStore, dump, read_file
from pytest_moeperf.store.entries import BaselineEntry

METRICS = 300
BASELINES = Path(__file__).parents[2] / "baselines"
PROVENANCE = {"date": "2026-12-01T00:00:00+00:00", "git_commit": "abc", "software": {"torch": "2"}}


def _store(root: Path) -> BaselineStore:
    return BaselineStore(root, "cpu-test", host="h-a")


@pytest.fixture
def big(tmp_path: Path) -> Path:
    """A file of `METRICS` metrics of 30 tests, three runs each."""
    store = _store(tmp_path)
    measured = [Measurement(f"t.py::test_{i % 30}", f"m{i}", (1.0 + i, 2.0 + i, 3.0 + i), "us", "lower")
                for i in range(METRICS)]
    for _ in range(3):
        store.update(measured, {"slug": "cpu-test", "hash": "0"}, PROVENANCE, host_facts={"cpus": 2})
    return tmp_path


def _made(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The keys of the entries made from the file's JSON from now on."""
    keys: list[str] = []
    real = BaselineEntry.from_json.__func__  # type: ignore[attr-defined]
    monkeypatch.setattr(BaselineEntry, "from_json",
                        classmethod(lambda cls, key, *args, **kw: keys.append(key) or real(cls, key, *args, **kw)))
    return keys


def _encoded(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The keys of the entries encoded as JSON from now on."""
    keys: list[str] = []
    real = BaselineEntry.to_json
    monkeypatch.setattr(BaselineEntry, "to_json", lambda self: keys.append(self.key) or real(self))
    return keys


def test_judging_makes_only_the_metrics_it_uses(big: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    made = _made(monkeypatch)
    store = _store(big)
    assert store.entry("t.py::test_7::m7") is not None
    assert {e.key for e in store.entries_of("t.py::test_7")} == {f"t.py::test_7::m{i}" for i in range(7, METRICS, 30)}
    assert store.family_spread("t.py::test_7::m7") is None  # each name is one case: no family
    assert sorted(made) == sorted(f"t.py::test_7::m{i}" for i in range(7, METRICS, 30)), "every metric was made"


def test_an_update_encodes_only_the_metrics_it_measured(big: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = big / "cpu-test" / "t.json"
    before = json.loads(path.read_text())
    encoded = _encoded(monkeypatch)
    _store(big).update([Measurement("t.py::test_3", "m3", (9.0, 9.0, 9.0), "us", "lower")],
                       {"slug": "cpu-test", "hash": "0"}, PROVENANCE)
    assert encoded == ["t.py::test_3::m3"], "every metric of the file was encoded again"
    after = json.loads(path.read_text())
    assert len(after["metrics"]["t.py::test_3::m3"]["runs"]) == 4
    del before["metrics"]["t.py::test_3::m3"], after["metrics"]["t.py::test_3::m3"]
    assert after == before
    monkeypatch.undo()
    found = read_file(path)
    assert path.read_text() == dump(found.fingerprint, dict(found.entries), found.hosts), "the same layout"


@pytest.mark.parametrize("path", sorted(BASELINES.glob("*/*.json")), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_the_layout_is_the_standard_librarys_byte_for_byte(path: Path) -> None:
    """Every committed baseline file: written back unchanged by an update that touches nothing of it, and by
    `dump`; both are ``json.dumps(document, indent=2, sort_keys=True)``."""
    text = path.read_text()
    assert text == json.dumps(json.loads(text), indent=2, sort_keys=True) + "\n"
    found = read_file(path)
    assert "".join(baselines.update_text(found.fingerprint, found.hosts, found.entries, {})) == text
    assert dump(found.fingerprint, dict(found.entries), found.hosts) == text
