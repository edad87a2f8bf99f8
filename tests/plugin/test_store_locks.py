"""Writers of one baselines tree, as real processes (issue 30, items 2, 9 and 12): ``--moeperf-update`` and
``moeperf baselines merge`` take turns on one lock, no clean-up deletes another writer's temporary file, a journal
is relative to its tree, and a waiter says who holds the lock and gives up after its timeout."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

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
    if str(src).endswith(files.TMP_SUFFIX) and dst != root / files.HOLDER_NAME and not (flags / "go").exists():
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
    assert merge.stderr is not None
    waiting = merge.stderr.readline()  # the merge waits, naming the update that holds the lock (item 12)
    assert f"moeperf baselines merge: waiting for the lock of {root} (0 s; --lock-timeout 600), held " \
           f"by pid {update.pid} on host " in waiting, waiting
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


#: holds the lock of a directory until ``go`` exists (a hung update); says so by creating ``held``
HOLDER = """
import sys, time
from pathlib import Path
from pytest_moeperf.store import files

root, flags = Path(sys.argv[1]), Path(sys.argv[2])
with files.locked(root):
    (flags / "held").write_text("")
    while not (flags / "go").exists():
        time.sleep(0.05)
"""

LAT = "def test_lat(perf):\n    perf.record('latency', [100.0] * 20, unit='us')\n"


@pytest.fixture
def held(tmp_path: Path) -> Iterator[tuple[Path, subprocess.Popen[str]]]:
    """A process holding the lock of ``<tmp>/held/baselines``."""
    root, flags = tmp_path / "held" / "baselines", tmp_path / "held" / "flags"
    flags.mkdir(parents=True)
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(root), str(flags), "--hung-update"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_for(flags / "held", proc)
    yield root, proc
    (flags / "go").write_text("")
    proc.communicate(timeout=60)


def test_an_update_waiting_for_a_hung_holder_names_it_and_gives_up(pytester: pytest.Pytester, run_moeperf,  # type: ignore[no-untyped-def]
                                                                   held: tuple[Path, subprocess.Popen[str]]) -> None:
    root, holder = held
    pytester.makepyfile(test_h=LAT)
    result = run_moeperf("--moeperf-update", "--moeperf-history", "off", "--moeperf-baselines", str(root),
                         "--moeperf-lock-timeout", "1.5")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    named = f"held by pid {holder.pid} on host {os.uname().nodename}, since 20*: -c {root} * --hung-update"
    result.stderr.fnmatch_lines([f"moeperf: waiting for the lock of {root} (0 s; --moeperf-lock-timeout "
                                 f"1.5), {named}"])
    result.stdout.fnmatch_lines([f"moeperf: baselines not updated: gave up after 2 s (--moeperf-lock-timeout 1.5) "
                                 f"waiting for the lock of {root}, {named}"])
    assert not list(root.rglob("test_h.json"))


def test_a_merge_waiting_for_a_hung_holder_names_it_and_gives_up(tmp_path: Path,
                                                                 held: tuple[Path, subprocess.Popen[str]]) -> None:
    root, holder = held
    _store(tmp_path / "src", "h-b")
    merge = _moeperf("baselines", "merge", str(tmp_path / "src"), "--into", str(root), "--lock-timeout", "1",
                     cwd=tmp_path)
    out, err = merge.communicate(timeout=60)
    assert merge.returncode == 2, out + err
    lines = err.splitlines()
    assert lines[0].startswith(f"moeperf baselines merge: waiting for the lock of {root} (0 s; --lock-timeout 1), "
                               f"held by pid {holder.pid} on host "), err
    assert lines[-1].startswith(f"moeperf baselines merge: gave up after 1 s (--lock-timeout 1) waiting for the "
                                f"lock of {root}, held by pid {holder.pid} on host "), err
    assert not (root / SLUG).exists()


def test_the_lock_holder_file_is_ignored_by_git() -> None:
    assert files.HOLDER_NAME in (Path(__file__).parents[2] / ".gitignore").read_text().splitlines()


#: a commit of two files killed (SIGKILL, no clean-up) between its two renames: the journal stays behind
KILLED_COMMIT = """
import os, signal, sys
from pathlib import Path
from pytest_moeperf.store import files

tree = Path(sys.argv[1])
real_replace = os.replace

def replace(src, dst):
    if str(dst).endswith("b.json"):
        os.kill(os.getpid(), signal.SIGKILL)
    real_replace(src, dst)

files.os.replace = replace
with files.locked(tree):
    files.commit(tree, {tree / "cpu" / "a.json": "A\\n", tree / "cpu" / "b.json": "B\\n"})
"""


def _snapshot(tree: Path) -> dict[str, bytes]:
    return {str(p.relative_to(tree)): p.read_bytes() for p in sorted(tree.rglob("*")) if p.is_file()}


def test_a_tree_copied_after_a_killed_commit_is_finished_in_the_copy_only(tmp_path: Path) -> None:
    original, copy = tmp_path / "original", tmp_path / "copy"
    (original / "cpu").mkdir(parents=True)
    (original / "cpu" / "b.json").write_text("old B\n")
    killed = subprocess.run([sys.executable, "-c", KILLED_COMMIT, str(original)], capture_output=True, text=True)
    assert killed.returncode == -9, killed.stderr
    assert (original / files.JOURNAL_NAME).exists() and (original / "cpu" / "b.json").read_text() == "old B\n"
    journal = json.loads((original / files.JOURNAL_NAME).read_text())
    shutil.copytree(original, copy)
    before = _snapshot(original)
    with files.locked(copy):  # the next update of the copy finishes the copy's commit
        pass
    assert _snapshot(original) == before, "recovery in the copy wrote into the original tree"
    assert (copy / "cpu" / "a.json").read_text() == "A\n" and (copy / "cpu" / "b.json").read_text() == "B\n"
    assert not (copy / files.JOURNAL_NAME).exists() and not list(copy.rglob(f"*{files.TMP_SUFFIX}"))
    with files.locked(original):  # and the original's own next update finishes it there
        pass
    assert (original / "cpu" / "b.json").read_text() == "B\n"
    assert all(not Path(name).is_absolute() for pair in journal.items() for name in pair), journal


def test_a_journal_naming_paths_outside_its_tree_is_refused(tmp_path: Path) -> None:
    """An older version's journal (absolute paths) in a copied tree names the original's files."""
    original, copy = tmp_path / "original", tmp_path / "copy"
    (original / "cpu").mkdir(parents=True)
    (copy / "cpu").mkdir(parents=True)
    (original / "cpu" / ".b.json.x.moeperf.tmp").write_text("B\n")
    journal = {str(original / "cpu" / ".b.json.x.moeperf.tmp"): str(original / "cpu" / "b.json")}
    (copy / files.JOURNAL_NAME).write_text(json.dumps(journal))
    with pytest.raises(files.FileFormatError, match=f"journal {copy / files.JOURNAL_NAME} names .*original.*, "
                                                    f"outside {copy}"):
        with files.locked(copy):
            pass
    assert not (original / "cpu" / "b.json").exists() and (copy / files.JOURNAL_NAME).exists()


def test_an_update_into_a_tree_with_a_foreign_journal_says_so(pytester: pytest.Pytester, run_moeperf) -> None:  # type: ignore[no-untyped-def]
    pytester.makepyfile(test_h=LAT)
    root = pytester.path / "baselines"
    root.mkdir()
    (root / files.JOURNAL_NAME).write_text(json.dumps({"/elsewhere/.t.json.x.moeperf.tmp": "/elsewhere/t.json"}))
    result = run_moeperf("--moeperf-update", "--moeperf-history", "off")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines([f"moeperf: baselines not updated: commit journal {root / files.JOURNAL_NAME} names "
                                 f"/elsewhere/.t.json.x.moeperf.tmp, outside {root}: *"])
