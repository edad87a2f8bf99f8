"""Baselines that cannot be read are named, never read as "no baselines" (issue 37, items 3 and 14).

A fingerprint folder or a baseline file that is a symlink to nothing (a shared mount that is not mounted), a symlink
loop or a file where a folder should be read as absent: every metric NEW, exit 0, even under ``--moeperf-strict``.
A key given twice in a hand-edited baseline file was accepted, the last one winning. Each now fails the tests that
need the file, naming the path (or the key), and an update leaves it as it is.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from pytest_moeperf.store import jsontext
from pytest_moeperf.store.entries import BaselineError
from pytest_moeperf.store.trees import parse_tree_texts

LAT = """
def test_lat(perf):
    perf.record("latency", [100.0, 101.0, 99.0, 100.0, 102.0], unit="us")
"""
NOWHERE = "/nonexistent/place"


def _slug_dir(root: Path) -> Path:
    [slug] = [p for p in root.iterdir() if p.is_dir()]
    return slug


def _dangling(path: Path) -> None:
    path.rename(path.with_name(path.name + ".moved"))
    path.symlink_to(NOWHERE)


def _loop(path: Path) -> None:
    path.rename(path.with_name(path.name + ".moved"))
    path.symlink_to(path.name)  # itself


def _plain_file(path: Path) -> None:
    path.rename(path.with_name(path.name + ".moved"))
    path.write_text("not a folder\n")


BREAKS: dict[str, tuple[Callable[[Path], Path], Callable[[Path], None], str]] = {
    "slug-dangling": (_slug_dir, _dangling, f"is a symlink to {NOWHERE}, which does not exist"),
    "slug-loop": (_slug_dir, _loop, "cannot be read (Too many levels of symbolic links)"),
    "slug-file": (_slug_dir, _plain_file, "is not a folder"),
    "file-dangling": (lambda root: _slug_dir(root) / "test_h.json", _dangling,
                      f"is a symlink to {NOWHERE}, which does not exist"),
    "file-loop": (lambda root: _slug_dir(root) / "test_h.json", _loop,
                  "cannot be read (Too many levels of symbolic links)"),
    "root-dangling": (lambda root: root, _dangling, f"is a symlink to {NOWHERE}, which does not exist"),
}


def _state(path: Path) -> str:
    return f"link {os.readlink(path)}" if path.is_symlink() else path.read_text()


@pytest.mark.parametrize("how", sorted(BREAKS))
def test_a_baseline_that_cannot_be_reached_fails_its_test_naming_the_path(
        pytester: pytest.Pytester, run_moeperf, how: str) -> None:  # type: ignore[no-untyped-def]
    pytester.makepyfile(test_h=LAT)
    assert run_moeperf("--moeperf-update", "--moeperf-history", "off").ret == pytest.ExitCode.OK
    where, breaks, message = BREAKS[how]
    path = where(pytester.path / "baselines")
    breaks(path)
    before = _state(path)
    for strict in ((), ("--moeperf-strict",)):
        result = run_moeperf("--moeperf-history", "off", *strict)
        out = result.stdout.str()
        result.assert_outcomes(failed=1)
        assert f"{path} {message}" in out and "NEW" not in out, out
    update = run_moeperf("--moeperf-update", "--moeperf-history", "off")
    assert update.ret == pytest.ExitCode.TESTS_FAILED
    assert f"{path} {message}" in update.stdout.str() and "baselines updated" not in update.stdout.str()
    assert _state(path) == before, "left as it was"


def _twice(pytester: pytest.Pytester, run_moeperf, inside: bool) -> tuple[Path, str]:  # type: ignore[no-untyped-def]
    """A stored file whose metric is given twice (the first a hand-edited copy at twice the value), or whose
    metric's summary names ``median`` twice."""
    pytester.makepyfile(test_h=LAT)
    assert run_moeperf("--moeperf-update", "--moeperf-history", "off").ret == pytest.ExitCode.OK
    path = _slug_dir(pytester.path / "baselines") / "test_h.json"
    doc = json.loads(path.read_text())
    [(key, entry)] = doc["metrics"].items()
    if inside:
        summary = json.dumps(entry["summary"])
        entry_text = json.dumps(entry).replace(summary, summary[:-1] + ', "median": 1.0}')
    else:
        edited = json.loads(json.dumps(entry))
        edited["summary"]["median"] *= 2
        entry_text = f"{json.dumps(edited)}, {json.dumps(key)}: {json.dumps(entry)}"
    doc["metrics"] = "@"
    text = json.dumps(doc, indent=2).replace('"@"', f"{{{json.dumps(key)}: {entry_text}}}")
    path.write_text(text)
    return path, text


@pytest.mark.parametrize(("inside", "named"), [(False, "test_h.py::test_lat::latency"), (True, "median")])
def test_a_key_given_twice_is_refused_naming_it_and_never_overwritten(
        pytester: pytest.Pytester, run_moeperf, inside: bool, named: str) -> None:  # type: ignore[no-untyped-def]
    path, text = _twice(pytester, run_moeperf, inside)
    message = f"baseline file {path}: key '{named}' appears twice in one object (JSON would keep the last)"
    for args in ((), ("--moeperf-update",)):
        result = run_moeperf("--moeperf-history", "off", *args)
        assert result.ret == pytest.ExitCode.TESTS_FAILED
        result.assert_outcomes(failed=1)
        assert message in result.stdout.str() and "PASS" not in result.stdout.str(), result.stdout.str()
    assert path.read_text() == text


def test_a_revision_with_a_key_twice_is_refused() -> None:
    """``moeperf baselines diff --rev``: the same reader for a file read from git."""
    with pytest.raises(BaselineError, match="baseline file s/t.json: key 'k' appears twice in one object"):
        parse_tree_texts({"s/t": '{"schema": 2, "metrics": {"k": {}, "k": {}}}'})


# ------------------------------------------------------------------------------------------ the reader
SAMPLES = ['{"metrics": {"a": {"b": [1, 2.5, null]}, "c": {}}, "schema": 2}', ' {"metrics": {}} \n', "[1]", "3",
           '{"metrics": [1]}', '{"x": {"metrics": {}}, "metrics": {"y": "z"}}', "{", '{"a": 1,}', '{"a" 1}',
           '{"metrics": {"k": 1 "j": 2}}', '{"a": 1} x', "\ufeff{}", '{"metrics": {"a": NaN}}', "",
           '{"metrics": {"a": "\\u00e9\\n"}}']


@pytest.mark.parametrize("text", SAMPLES)
def test_the_reader_is_json_loads_with_unique_keys_and_spans(text: str) -> None:
    try:
        expected: object = json.loads(text)
    except json.JSONDecodeError as exc:
        expected = str(exc)
    seen: dict[str, object] = {}

    def keep(key: str, value: object) -> str:
        seen[key] = value
        return key
    try:
        found, spans = jsontext.loads_spans(text, "metrics", keep)
    except json.JSONDecodeError as exc:
        assert str(exc) == expected
        return
    if isinstance(found, dict) and spans:
        found["metrics"] = seen
    assert json.dumps(found, sort_keys=True) == json.dumps(expected, sort_keys=True)  # NaN != NaN, "NaN" == "NaN"
    for key, (start, end, kept) in spans.items():
        assert kept == key and json.dumps(json.loads(text[start:end])) == json.dumps(seen[key])


@pytest.mark.parametrize("text", ['{"a": 1, "a": 1}', '{"metrics": {"a": 1, "a": 2}}', '{"metrics": {"a": {"b": 1, '
                                  '"b": 1}}}', '[{"b": 1, "b": 2}]', '{"metrics": 1, "metrics": 2}'])
def test_the_reader_refuses_a_key_twice_at_every_level(text: str) -> None:
    with pytest.raises(jsontext.DuplicateKey, match="appears twice in one object"):
        jsontext.loads_spans(text, "metrics", lambda key, value: None)
    with pytest.raises(jsontext.DuplicateKey):
        jsontext.loads(text)
