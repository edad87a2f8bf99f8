"""Build a dashboard: read the window from the history store (SQLite or PostgreSQL alike), find the change points,
render every page, and put the site at ``--out`` whole or not at all.

Everything is read and checked before anything is written; the site is written into a fresh folder beside ``--out``
and renamed into place, replacing an earlier dashboard only (a folder holding `render.MANIFEST`) or an empty folder;
what an earlier dashboard holds that its build did not write (its manifest lists the files) is copied into the new
one and named. An ``--out`` that is a symlink stays one, and the site goes where it points. An ``--out`` that cannot
be renamed (``.``, a folder above the current one, a mount point) is refilled where it is (`_refill`).
A failure at any step removes the new folder and leaves ``--out`` as it was."""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pytest_moeperf.dashboard import abresults, changes, model, render
from pytest_moeperf.dashboard.window import Window, select
from pytest_moeperf.history.cli import open_history
from pytest_moeperf.history.store import HistoryError
from pytest_moeperf.history.targets import redact
from pytest_moeperf.history.trend import MAX_PVALUE, MIN_MAGNITUDE, Step

_WORK = ".moeperf-dashboard"  # the build's own folders inside an --out refilled in place (`_refill`)
DEFAULT_SESSIONS = 50  # Otava's own window: one change-point search a series
DEFAULT_SPARK = 30


class DashboardError(RuntimeError):
    """The dashboard cannot be built from this input, or cannot be written where asked."""


@dataclass(frozen=True)
class Options:
    target: str  # the history: SQLite path or postgresql:// URL
    out: Path
    sessions: int = DEFAULT_SESSIONS  # per lane (fingerprint x host)
    spark: int = DEFAULT_SPARK  # sessions in an index sparkline
    jobs: int = 1
    max_pvalue: float = MAX_PVALUE  # the detector's settings, as `moeperf trend`'s
    min_magnitude: float = MIN_MAGNITUDE
    ab: Sequence[Path] = ()
    commit_url: str | None = None  # a link template with {commit}
    title: str = "moeperf dashboard"


@dataclass(frozen=True)
class Built:
    out: Path
    shown: int  # sessions in the window
    total: int  # sessions in the history
    metrics: int
    families: int
    change_points: int
    seconds: Mapping[str, float] = field(default_factory=dict)  # per phase: read, detect, render, write
    kept: tuple[str, ...] = ()  # files of the earlier dashboard at --out that no build wrote (CNAME, .nojekyll)
    dropped: tuple[str, ...] = ()  # such files not kept, each with why


def is_dashboard(path: Path) -> bool:
    return (path / render.MANIFEST).is_file()


def destination(out: Path) -> Path:
    """Where the site goes: ``out``, or where it points when it is a symlink (the link is kept; what it points to is
    written as ``out`` itself would be)."""
    if not out.is_symlink():
        return out
    try:
        return out.resolve()
    except (OSError, RuntimeError) as exc:  # a loop: RuntimeError before Python 3.13
        raise DashboardError(f"--out {out} is a symlink that cannot be followed: {exc}") from None


def check_out(out: Path) -> None:
    """``--out`` may be new, an empty folder or an earlier dashboard (or a symlink to one of these); anything else is
    refused before any work."""
    where = destination(out)
    named = f"--out {out}" + (f" (a symlink to {where})" if where != out else "")
    if where.exists() and not where.is_dir():
        raise DashboardError(f"{named} is a file, not a folder")
    if where.is_dir() and any(where.iterdir()) and not is_dashboard(where):
        raise DashboardError(f"{named} exists and is not a moeperf dashboard (no {render.MANIFEST} in it): "
                             "name a new or empty folder, or an earlier dashboard to replace")


def pages(window: Window, series: model.Series, steps: Mapping[tuple[str, int], Sequence[Step]],
          options: Options, matched: Mapping[int, Sequence[abresults.AbReport]]) -> dict[str, str]:
    """Every file of the site but the static assets, by path relative to its root."""
    files = {"data/sessions.js": render.sessions_js(model.sessions_payload(window, options.commit_url,
                                                                           redact(options.target))),
             "index.html": render.page(options.title, {"kind": "index", "spark": options.spark,
                                                       "rows": model.index_rows(window, series, steps)}, 0)}
    for key, lanes in series.items():
        sids = [sid for points in lanes.values() for sid, _ in points]
        payload = model.metric_payload(key, lanes, steps, window, abresults.for_metric(key, sids, matched))
        files[model.page_of(key)] = render.page(key, {"kind": "metric", **payload}, 1)
    return files


def _entries(site: Path, skip: Collection[str] = ()) -> Iterator[tuple[str, Path]]:
    """Every file, link and other non-folder under ``site`` (links are not followed), by relative path; the entries
    of ``site`` named in ``skip`` are passed over."""
    for folder, dirs, names in os.walk(site):
        base = Path(folder)
        if base == site:
            dirs[:] = [d for d in dirs if d not in skip]
            names = [n for n in names if n not in skip]
        for name in sorted([d for d in dirs if (base / d).is_symlink()] + names):
            yield (base / name).relative_to(site).as_posix(), base / name


def carry_over(old: Path, fresh: Path, files: Collection[str], skip: Collection[str] = ()
               ) -> tuple[list[str], list[str]]:
    """Copy into ``fresh`` what the earlier dashboard ``old`` holds that its build did not write (by its manifest:
    a ``CNAME``, a ``.nojekyll``, a page of one's own); the copies leave ``old`` whole until the rename. Returns the
    paths kept, and those not kept with why. The entries of ``old`` named in ``skip`` (the build's own folders
    inside it, `_refill`) are not looked at."""
    if not is_dashboard(old):
        return [], []
    ours = render.written((old / render.MANIFEST).read_text(errors="replace"))
    kept, dropped = [], []
    for name, path in sorted(_entries(old, skip)):
        if ours(name):
            continue
        if name in files or any(f.startswith(f"{name}/") for f in files):
            dropped.append(f"{name} (the build writes its own)")
            continue
        mode, target = path.lstat().st_mode, fresh / name
        if not stat.S_ISLNK(mode) and not stat.S_ISREG(mode):
            dropped.append(f"{name} (not a regular file or a symlink)")
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        if stat.S_ISLNK(mode):
            target.symlink_to(os.readlink(path))
        else:
            shutil.copy2(path, target)
        kept.append(name)
    return kept, dropped


def _fill(folder: Path, files: Mapping[str, str | bytes]) -> None:
    for name, content in files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content.encode() if isinstance(content, str) else content)


def _in_place(out: Path) -> bool:
    """Whether ``out`` is a folder refilled where it is (`_refill`) rather than replaced by a rename: the current
    folder (``--out .``, which cannot be renamed: "Device or resource busy") or one above it (renamed, a shell
    started there would be left in a deleted folder), or a mount point (which cannot be renamed either)."""
    if not out.is_dir():
        return False
    real, here = Path(os.path.realpath(out)), Path(os.path.realpath(os.getcwd()))
    return real == here or real in here.parents or os.path.ismount(real)


def _refill(out: Path, files: Mapping[str, str | bytes]) -> tuple[list[str], list[str]]:
    """`write_site` into a folder that stays where it is (`_in_place`): the site is written into a fresh folder
    inside it, then what it held is moved aside into another and the site's entries moved in, a rename each (a few:
    ``index.html``, ``m/``, ``data/``, ``static/``, the manifest); a failure moves everything back, and nothing of
    ours is left."""
    fresh = Path(tempfile.mkdtemp(prefix=f"{_WORK}.building-", dir=out))
    old = Path(tempfile.mkdtemp(prefix=f"{_WORK}.old-", dir=out))
    ours = {fresh.name, old.name}
    moved_aside: list[str] = []
    moved_in: list[str] = []
    try:
        _fill(fresh, files)
        kept = carry_over(out, fresh, files.keys(), skip=ours)
        for name in sorted(set(os.listdir(out)) - ours):
            os.rename(out / name, old / name)
            moved_aside.append(name)
        for name in sorted(os.listdir(fresh)):
            os.rename(fresh / name, out / name)
            moved_in.append(name)
    except BaseException:
        for name in moved_in:
            os.rename(out / name, fresh / name)
        for name in moved_aside:
            os.rename(old / name, out / name)
        shutil.rmtree(fresh, ignore_errors=True)
        with contextlib.suppress(OSError):
            old.rmdir()  # empty again: what it held is back in place
        raise
    fresh.rmdir()
    shutil.rmtree(old, ignore_errors=True)
    return kept


def write_site(out: Path, files: Mapping[str, str | bytes]) -> tuple[list[str], list[str]]:
    """Write ``files`` into a fresh folder beside ``out`` (beside where it points, when it is a symlink), with what an
    earlier dashboard there holds that its build did not write (`carry_over`), then rename it into place (replacing
    what `check_out` allowed); on any failure nothing new is left and ``out`` is as it was. Returns `carry_over`'s
    lists."""
    out = destination(out)
    if _in_place(out):
        return _refill(out, files)
    out.parent.mkdir(parents=True, exist_ok=True)
    fresh = Path(tempfile.mkdtemp(prefix=f".{out.name}.building-", dir=out.parent))
    try:
        _fill(fresh, files)
        kept = carry_over(out, fresh, files.keys()) if out.is_dir() else ([], [])
        os.chmod(fresh, 0o755)  # mkdtemp's 0700 would hide the site from a web server's user
        old = None
        if out.exists():
            old = out.parent / f".{out.name}.old-{os.getpid()}"
            out.rename(old)
        try:
            fresh.rename(out)
        except OSError:
            if old is not None:
                old.rename(out)
            raise
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        return kept
    except BaseException:
        shutil.rmtree(fresh, ignore_errors=True)
        raise


def build(options: Options, progress: Callable[[str], None] = lambda _: None) -> Built:
    check_out(options.out)
    try:
        reports, notes = abresults.read(options.ab)
    except abresults.AbReportError as exc:
        raise DashboardError(str(exc)) from None
    for note in notes:
        progress(note)
    clock, seconds = time.perf_counter(), {}
    with open_history(options.target) as store:
        sessions = store.sessions()
        if not sessions:
            raise DashboardError(f"history {redact(options.target)} holds no session yet: run the suites with "
                                 "--moeperf-history first")
        window = select(sessions, options.sessions)
        progress(f"history {redact(options.target)}: {len(sessions)} sessions; reading the last "
                 f"{options.sessions} of each of {len(window.lanes)} host(s): {len(window.sessions)} sessions")
        series = model.collect(window, store.metrics_of(window.ids))
    if not series:
        raise DashboardError(f"history {redact(options.target)}: its sessions hold no metric")
    seconds["read"] = time.perf_counter() - clock
    values = model.medians(series)
    progress(f"change points: {len(values)} series of {len(series)} metrics, {options.jobs} process(es)")
    clock = time.perf_counter()
    steps = changes.all_steps(values, options.jobs, options.max_pvalue, options.min_magnitude)
    seconds["detect"] = time.perf_counter() - clock
    clock = time.perf_counter()
    files: dict[str, str | bytes] = {f"static/{k}": v for k, v in render.static_files().items()}
    matched = abresults.by_session(reports, window)
    if options.ab:
        shown = len({id(r) for found in matched.values() for r in found})
        progress(f"A/B reports: {len(reports)} read, {shown} beside a session shown (the same head commit)")
    files.update(pages(window, series, steps, options, matched))
    found = sum(len(s) for s in steps.values())
    families = len({model.family_of(k) for k in series})
    files[render.MANIFEST] = render.manifest({"sessions": len(window.sessions), "history_sessions": window.total,
                                              "metrics": len(series), "families": families, "change_points": found,
                                              "latest": window.latest, "source": redact(options.target)}, files)
    seconds["render"] = time.perf_counter() - clock
    clock = time.perf_counter()
    progress(f"writing {len(files)} files to {options.out}")
    try:
        kept, dropped = write_site(options.out, files)
    except OSError as exc:
        raise DashboardError(f"cannot write the dashboard to {options.out}: {exc.strerror or exc}") from None
    seconds["write"] = time.perf_counter() - clock
    if kept:
        progress(f"kept {len(kept)} file(s) of {options.out} that no build wrote: {', '.join(kept[:10])}"
                 + (f" and {len(kept) - 10} more" if len(kept) > 10 else ""))
    if dropped:
        progress(f"not kept from {options.out}: {', '.join(dropped)}")
    return Built(out=options.out, shown=len(window.sessions), total=window.total, metrics=len(series),
                 families=families, change_points=found, seconds=seconds, kept=tuple(kept), dropped=tuple(dropped))


def guarded(options: Options, progress: Callable[[str], None]) -> Built:
    """`build`, with a history that cannot be opened or read turned into a `DashboardError`."""
    try:
        return build(options, progress)
    except HistoryError as exc:
        raise DashboardError(str(exc)) from None
