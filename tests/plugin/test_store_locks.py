"""Writers of one baselines tree, as real processes (issue 30, items 2, 9 and 12): ``--moeperf-update`` and
``moeperf baselines merge`` take turns on one lock, no clean-up deletes another writer's temporary file, a journal
is relative to its tree, and a waiter says who holds the lock and gives up after its timeout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from pytest_moeperf.ledger import Measurement
from pytest_moeperf.store import files
from pytest_moeperf.store.baselines import BaselineStore, read_file

SLUG = "cpu-test"
FINGERPRINT = {"slug": SLUG, "hash": "0"}

#: an update by host ``h-u`` that stops once its new files are written, before it renames them into place, until
#: ``go`` exists (it says so by creating ``paused``): a slow disk, or a session killed later, in slow motion
PAUSED_UPDATE = """
import os, sys, time
from pathlib import Path
from pytest_moeperf.ledger import Measurement
from pytest_moeperf.store import files
from pytest_moeperf.store.baselines import BaselineStore

root, flags = Path(sys.argv[1]), Path(sys.argv[2])
real_replace = os.replace

def replace(src, dst):
    if str(src).endswith(files.TMP_SUFFIX) and not (flags / "go").exists():
        (flags / "paused").write_text(str(os.getpid()))
        while not (flags / "go").exists():
            time.sleep(0.05)
    real_replace(src, dst)

files.os.replace = replace
BaselineStore(root, "cpu-test", host="h-u").update(
    [Measurement("t.py::test_m", "time", (5.0, 5.0, 5.0), "us", "lower")], {"slug": "cpu-test", "hash": "0"},
    {"date": "2026-12-02T00:00:00+00:00", "host_id": "h-u"})
"""


def _store(root: Path, host: str) -> None:
    BaselineStore(root, SLUG, host=host).update([Measurement("t.py::test_m", "time", (1.0, 2.0, 3.0), "us", "lower")],
                                                FINGERPRINT, {"date": "2026-12-01T00:00:00+00:00", "host_id": host})


def _hosts(root: Path) -> list[str | None]:
    return sorted(str(r.host) for r in read_file(root / SLUG / "t.json").entries["t.py::test_m::time"].all_runs)


def _wait_for(path: Path, proc: subprocess.Popen[str], seconds: float = 60) -> None:
    end = time.monotonic() + seconds
    while not path.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < end, f"{path} never appeared"
        time.sleep(0.05)


def _moeperf(*args: str, cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "pytest_moeperf.cli", *args], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_a_merge_during_an_update_waits_for_it_and_both_keep_their_runs(tmp_path: Path) -> None:
    root, source, flags = tmp_path / "baselines", tmp_path / "other-runner", tmp_path / "flags"
    flags.mkdir()
    _store(root, "h-a")
    _store(source, "h-b")
    update = subprocess.Popen([sys.executable, "-c", PAUSED_UPDATE, str(root), str(flags)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    _wait_for(flags / "paused", update)  # the update holds its lock, its temporary file written
    merge = _moeperf("baselines", "merge", str(source), "--into", str(root), cwd=tmp_path)
    try:
        merge.wait(5)  # a merge that does not wait for the update finishes in well under a second here
    except subprocess.TimeoutExpired:
        pass
    (flags / "go").write_text("")
    update_out, merge_out = update.communicate(timeout=60), merge.communicate(timeout=60)
    assert update.returncode == 0, update_out
    assert merge.returncode == 0, merge_out
    assert _hosts(root) == ["h-a", "h-b", "h-u"]
    assert not list(root.rglob(f"*{files.TMP_SUFFIX}")) and not list(root.rglob(files.JOURNAL_NAME))


def test_a_clean_up_leaves_the_temporary_file_of_a_live_writer(tmp_path: Path) -> None:
    """A file being written without the lock (a report, a topology) beside a tree being recovered."""
    directory = tmp_path / "baselines"
    (directory / SLUG).mkdir(parents=True)
    live = files._write_temp(directory / SLUG / "report.json", "{}")
    dead = directory / SLUG / f".t.json.999999999@{os.uname().nodename}.x{files.TMP_SUFFIX}"
    dead.write_text("left by a writer that was killed")
    with files.locked(directory):
        pass
    assert live.exists() and not dead.exists()
    files.atomic_write(directory / SLUG / "report.json", "{}")
    assert json.loads((directory / SLUG / "report.json").read_text()) == {}
    live.unlink()
