"""Files the plugin writes and reads: the one atomic writer, the one reader of a JSON-object file, and the lock and
transaction that make an update of several files one step.

* `atomic_write`: a temporary file in the same directory, fsync, rename; the file gets the mode a plain ``open()``
  would give it (0666 less the umask), never mkstemp's 0600. It writes *to* what sits at the path, never instead
  of it: through a symlink to its target; into a FIFO, a device or ``/dev/stdout`` in place.
* `read_json_object`: one error mapping for every JSON-object file we read (baselines, profiles, topologies,
  reports): `FileFormatError` naming the file, never a traceback. A key given twice in one object (a hand edit;
  JSON would keep the last) is refused, naming the key (`jsontext.loads`).
* `locked`: an exclusive ``fcntl`` lock on a directory (``.moeperf.lock`` in it): every writer of a baselines tree
  (``--moeperf-update`` of any fingerprint, ``moeperf baselines merge``) locks its root, so they take turns instead
  of losing each other's runs. Its holder writes who it is (pid, host, command, since when) to
  ``.moeperf-lock-holder.json`` beside the lock; a waiter names it in a progress line every 30 s and gives up after
  its timeout with `LockTimeout`, naming it.
* `commit`: several files replaced as one transaction. The new texts are written to temporary files, a journal
  naming them is written atomically, then each is renamed into place and the journal removed. A kill at any point
  leaves either the old files (no journal yet) or a journal that the next `locked` entry rolls forward. The
  journal names its files relative to the locked directory, so a tree copied after a kill is finished in the copy;
  a journal that names a path outside its tree is refused (`FileFormatError`), nothing moved. Stray temporary
  files of ours are removed there too, but only a dead writer's: a temporary file's name carries its writer
  (``<pid>@<host>``), so a writer that does not take the lock (a report) keeps its own.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import json
import os
import re
import socket
import stat
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from pytest_moeperf.store import jsontext

LOCK_NAME = ".moeperf.lock"
HOLDER_NAME = ".moeperf-lock-holder.json"
DEFAULT_LOCK_TIMEOUT_S = 600.0
PROGRESS_EVERY_S = 30.0
JOURNAL_NAME = ".moeperf-journal.json"
TMP_SUFFIX = ".moeperf.tmp"
_HOST = re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname())[:40]
_WRITER = re.compile(r"\.(\d+)@([A-Za-z0-9-]*)\.[^.]*" + re.escape(TMP_SUFFIX) + "$")


class FileFormatError(ValueError):
    """A file that cannot be read as what it should be; the message names the file."""


class LockTimeout(TimeoutError):
    """A directory's lock was not had within the timeout; the message names its holder."""


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


#: a file's text: one string, or its pieces in order (written as they come: a large file is never held twice)
Text = str | Iterable[str]
_PIECE = 1 << 20  # characters encoded at a time


def _pieces(text: Text) -> Iterator[str]:
    if not isinstance(text, str):
        yield from text
        return
    for start in range(0, len(text), _PIECE):
        yield text[start:start + _PIECE]


def _write_temp(path: Path, text: Text) -> Path:
    """``text`` in a new temporary file beside ``path`` (same file system), flushed to disk."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.{os.getpid()}@{_HOST}.", suffix=TMP_SUFFIX, dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            for piece in _pieces(text):
                handle.write(piece)
            handle.flush()
            os.fsync(handle.fileno())
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return Path(tmp)


def _target(path: Path) -> Path | int | None:
    """Where a write to ``path`` goes: the file to replace (a symlink's final target, or ``path``), a descriptor of
    this process to write to (``/dev/stdout``, ``/dev/fd/N``), or None: in place (a FIFO, a device, a socket, an
    open file of another process)."""
    current = Path(os.path.abspath(path))
    for _ in range(40):  # the kernel's own limit on a chain of links
        own = re.fullmatch(rf"/(?:dev/fd|proc/(?:self|{os.getpid()})/fd)/(\d+)", str(current))  # /dev/stdout's
        if own is not None:
            return int(own.group(1))
        if str(current).startswith("/proc/") or not current.is_symlink():
            break
        current = Path(os.path.normpath(Path(os.path.realpath(current.parent)) / os.readlink(current)))
    try:
        mode = os.stat(current).st_mode
    except FileNotFoundError:
        return None if str(current).startswith("/proc/") else current
    return current if stat.S_ISREG(mode) or stat.S_ISDIR(mode) else None


def atomic_write(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so that a crash leaves the old file whole (see the module docstring). What sits at
    ``path`` is written to, never replaced: a symlink's target is replaced (the link stays); a FIFO, a device or
    another process's open file is written in place; this process's own descriptor (``/dev/stdout``) is written
    to after what was printed before."""
    target = _target(path)
    if isinstance(target, int):
        sys.stdout.flush()
        sys.stderr.flush()
        data = text.encode("utf-8")
        while data:
            data = data[os.write(target, data):]
        return
    if target is None:
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(text)
        return
    tmp = _write_temp(target, text)
    try:
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_report(path: Path, text: str, append: bool = False) -> None:
    """A report file: appended to (a Markdown summary such as ``$GITHUB_STEP_SUMMARY`` collects several
    sessions), else written atomically. Raises `OSError`; an append that fails (a full disk) is taken back, so
    the file ends as it was, never with part of this session's text."""
    if append and path.exists() and not isinstance(_target(path), int):  # our stdout: after what we printed
        with open(path, "ab", buffering=0) as handle:
            start = handle.seek(0, os.SEEK_END) if handle.seekable() else None
            data = text.encode("utf-8")
            try:
                while data:
                    data = data[handle.write(data) or 0:]
            except BaseException:
                if start is not None:
                    handle.truncate(start)
                raise
    else:
        atomic_write(path, text)


def present(root: Path, path: Path, what: str) -> bool:
    """Whether the file ``path`` under the folder ``root`` is there to read: False when nothing stands at it or at a
    folder on the way from ``root`` (not created yet). Whatever else stands there raises `FileFormatError` naming its
    path, where a plain ``exists()`` reads "absent": a symlink to nothing (a shared folder that is not mounted), a
    symlink loop, a file where a folder should be, a folder, FIFO or device where the file should be."""
    parts = path.relative_to(root).parts
    chain = [root, *(root.joinpath(*parts[:i]) for i in range(1, len(parts) + 1))]
    for place in chain:
        try:
            mode = os.stat(place).st_mode
        except FileNotFoundError:
            if os.path.islink(place):
                raise FileFormatError(f"{what}: {place} is a symlink to {os.readlink(place)}, which does not exist "
                                      "(a shared folder not mounted?)") from None
            return False
        except OSError as exc:  # a loop (ELOOP), no permission
            raise FileFormatError(f"{what}: {place} cannot be read ({exc.strerror})") from None
        if place != path and not stat.S_ISDIR(mode):
            raise FileFormatError(f"{what}: {place} is not a folder")
        if place == path and not stat.S_ISREG(mode):
            raise FileFormatError(f"{what}: {place} is not a regular file")
    return True


@contextlib.contextmanager
def json_errors(what: str) -> Iterator[None]:
    """JSON that cannot be read (`jsontext`) as `FileFormatError` starting with ``what`` (the file it came from)."""
    try:
        yield
    except json.JSONDecodeError as exc:
        raise FileFormatError(f"{what} is not valid JSON: {exc}") from None
    except jsontext.DuplicateKey as exc:
        raise FileFormatError(f"{what}: {exc}") from None


def loads_object(text: str, what: str) -> Any:
    """``text`` parsed as JSON with every object's keys unique (`jsontext.loads`); `FileFormatError` starting with
    ``what`` otherwise."""
    with json_errors(what):
        return jsontext.loads(text)


#: which version of a file was read: its inode, size and modification time (a writer of ours replaces a file by a
#: rename, which gives it another inode)
Version = tuple[int, int, int]


def version(path: Path) -> Version | None:
    """The version of the file now at ``path`` (None: none can be had)."""
    try:
        found = os.stat(path)
    except OSError:
        return None
    return found.st_ino, found.st_size, found.st_mtime_ns


def read_text(path: Path, what: str) -> str:
    """The UTF-8 text of ``path``; `FileFormatError` names the file and ``what`` it should be."""
    return read_versioned(path, what)[0]


def read_versioned(path: Path, what: str) -> tuple[str, Version]:
    """The UTF-8 text of ``path`` and the version it is of (`version`); `FileFormatError` names the file and
    ``what`` it should be."""
    try:
        with open(path, "rb") as handle:
            found = os.fstat(handle.fileno())
            data = handle.read()
        return data.decode("utf-8"), (found.st_ino, found.st_size, found.st_mtime_ns)
    except IsADirectoryError:
        raise FileFormatError(f"{what} {path} is a directory, not a file") from None
    except OSError as exc:
        raise FileFormatError(f"{what} {path}: cannot read ({exc.strerror})") from None
    except UnicodeDecodeError as exc:
        raise FileFormatError(f"{what} {path} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def read_json_object(path: Path, what: str) -> dict[str, Any]:
    """Parse ``path`` as a JSON object; `FileFormatError` names the file and ``what`` it should be."""
    data = loads_object(read_text(path, what), f"{what} {path}")
    if not isinstance(data, dict):
        raise FileFormatError(f"{what} {path} must hold a JSON object, found {type(data).__name__}")
    return data


def _inside(base: Path, name: str) -> Path | None:
    """``name`` of a journal (relative to ``base``; an older version's: absolute) when it lies in ``base``."""
    path = Path(os.path.realpath(base / name))
    return path if path.is_relative_to(os.path.realpath(base)) else None


def _roll_forward(journal: Path) -> None:
    """Finish the commit a journal describes; refused (`FileFormatError`, nothing moved) when it names a path
    outside its own tree: the tree was copied or moved while the commit was interrupted."""
    base = journal.parent
    moves = read_json_object(journal, "commit journal")
    pairs = []
    for tmp, dest in moves.items():
        src, dst = _inside(base, tmp), _inside(base, str(dest))
        if src is None or dst is None:
            raise FileFormatError(f"commit journal {journal} names {tmp if src is None else dest}, outside {base}: "
                                  "was the tree copied or moved during an interrupted update? Nothing was rolled "
                                  "forward; check the files it names, then delete the journal")
        pairs.append((src, dst))
    for src, dst in pairs:
        if src.exists():
            os.replace(src, dst)
    journal.unlink(missing_ok=True)


def _recover(directory: Path) -> None:
    """Roll journals forward (an interrupted `commit`; an older version kept one in each fingerprint's directory),
    then remove our stray temporary files of writers that are gone."""
    for journal in (directory / JOURNAL_NAME, *sorted(directory.glob(f"*/{JOURNAL_NAME}"))):
        if journal.exists():
            _roll_forward(journal)
    for stray in directory.rglob(f".*{TMP_SUFFIX}"):
        if not _writer_alive(stray.name):
            stray.unlink(missing_ok=True)


def _writer_alive(name: str) -> bool:
    """Whether the writer a temporary file's name carries may still be writing it."""
    found = _WRITER.search(name)
    return found is not None and _alive(int(found.group(1)), found.group(2))  # an older version's: not named


def _alive(pid: int, host: str) -> bool:
    """Whether process ``pid`` of ``host`` may be running (another host's: it may)."""
    if host != _HOST:
        return True
    try:
        os.kill(pid, 0)
    except PermissionError:
        return True  # someone else's process
    except (ProcessLookupError, OverflowError):
        return False
    return True


def holder(directory: Path) -> str:
    """Who holds (or last held) the lock of ``directory``, as its holder file says."""
    try:
        found = read_json_object(directory / HOLDER_NAME, "lock holder file")
        pid, host, since = int(found["pid"]), str(found["host"]), str(found["since"])
        command = str(found.get("command", ""))
    except (FileFormatError, KeyError, TypeError, ValueError):
        return "a process that left no holder file (it may be starting, or an older version)"
    try:
        ago = f", {(dt.datetime.now(dt.UTC) - dt.datetime.fromisoformat(since)).total_seconds():.0f} s ago"
    except (ValueError, TypeError):
        ago = ""
    gone = " (no longer running: a process it started may hold the lock)" if not _alive(pid, host) else ""
    return f"pid {pid} on host {host}{gone}, since {since}{ago}: {command}"


def _acquire(handle: Any, directory: Path, timeout: float | None, progress: Callable[[str], None] | None,
             option: str) -> None:
    started = time.monotonic()
    said: float | None = None
    while True:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            waited = time.monotonic() - started
        if timeout is not None and waited >= timeout:
            raise LockTimeout(f"gave up after {waited:.0f} s ({option} {timeout:g}) waiting for the lock of "
                              f"{directory}, held by {holder(directory)}")
        if progress is not None and (said is None or waited - said >= PROGRESS_EVERY_S):
            limit = "" if timeout is None else f"; {option} {timeout:g}"
            progress(f"waiting for the lock of {directory} ({waited:.0f} s{limit}), held by {holder(directory)}")
            said = waited
        time.sleep(0.1)


@contextlib.contextmanager
def locked(directory: Path, timeout: float | None = None, progress: Callable[[str], None] | None = None,
           option: str = "lock timeout") -> Iterator[None]:
    """Hold the exclusive lock of ``directory`` (created as needed); entering finishes an interrupted commit.
    While another process holds it: ``progress`` lines name the holder; after ``timeout`` seconds (None: no
    limit) `LockTimeout` names it and ``option``, the setting that gives the timeout."""
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / LOCK_NAME, "a+") as handle:
        _acquire(handle, directory, timeout, progress, option)
        try:
            atomic_write(directory / HOLDER_NAME, json.dumps({
                "pid": os.getpid(), "host": _HOST, "command": " ".join(sys.argv)[:400],
                "since": dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat()}) + "\n")
            _recover(directory)
            yield
        finally:
            (directory / HOLDER_NAME).unlink(missing_ok=True)
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def commit(directory: Path, texts: Mapping[Path, Text]) -> list[Path]:
    """Replace every file of ``texts`` (all under ``directory``, whose lock the caller holds) in one transaction;
    the paths written. A text given in pieces is written as they come; one that raises leaves nothing."""
    if not texts:
        return []
    outside = [str(dest) for dest in texts if _inside(directory, str(dest)) is None]
    if outside:
        raise ValueError(f"commit into {directory}: {', '.join(outside)} lies outside it")
    temps: dict[Path, Path] = {}
    try:
        for dest, text in texts.items():
            temps[_write_temp(dest, text)] = dest
        journal = {os.path.relpath(tmp, directory): os.path.relpath(dest, directory) for tmp, dest in temps.items()}
        atomic_write(directory / JOURNAL_NAME, json.dumps(journal, indent=1))  # relative: a copied tree is whole
    except BaseException:
        for tmp in temps:
            tmp.unlink(missing_ok=True)
        raise
    for tmp, final in temps.items():
        os.replace(tmp, final)
    (directory / JOURNAL_NAME).unlink(missing_ok=True)
    return list(temps.values())
