"""Build a dashboard: read the window from the history store (SQLite or PostgreSQL alike), find the change points,
render every page, and put the site at ``--out`` whole or not at all.

Everything is read and checked before anything is written; the site is written into a fresh folder beside ``--out``
and renamed into place, replacing an earlier dashboard only (a folder holding `render.MANIFEST`) or an empty folder.
A failure at any step removes the new folder and leaves ``--out`` as it was."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pytest_moeperf.dashboard import abresults, changes, model, render
from pytest_moeperf.dashboard.window import Window, select
from pytest_moeperf.history.cli import open_history
from pytest_moeperf.history.store import HistoryError
from pytest_moeperf.history.targets import redact
from pytest_moeperf.history.trend import MAX_PVALUE, MIN_MAGNITUDE, Step

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


def is_dashboard(path: Path) -> bool:
    return (path / render.MANIFEST).is_file()


def check_out(out: Path) -> None:
    """``--out`` may be new, an empty folder or an earlier dashboard; anything else is refused before any work."""
    if out.exists() and not out.is_dir():
        raise DashboardError(f"--out {out} is a file, not a folder")
    if out.is_dir() and any(out.iterdir()) and not is_dashboard(out):
        raise DashboardError(f"--out {out} exists and is not a moeperf dashboard (no {render.MANIFEST} in it): "
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


def write_site(out: Path, files: Mapping[str, str | bytes]) -> None:
    """Write ``files`` into a fresh folder beside ``out``, then rename it into place (replacing what `check_out`
    allowed); on any failure nothing new is left and ``out`` is as it was."""
    out.parent.mkdir(parents=True, exist_ok=True)
    fresh = Path(tempfile.mkdtemp(prefix=f".{out.name}.building-", dir=out.parent))
    try:
        for name, content in files.items():
            path = fresh / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(content.encode() if isinstance(content, str) else content)
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
    except BaseException:
        shutil.rmtree(fresh, ignore_errors=True)
        raise


def build(options: Options, progress: Callable[[str], None] = lambda _: None) -> Built:
    check_out(options.out)
    try:
        reports = abresults.read(options.ab)
    except abresults.AbReportError as exc:
        raise DashboardError(str(exc)) from None
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
    files.update(pages(window, series, steps, options, abresults.by_session(reports, window)))
    found = sum(len(s) for s in steps.values())
    families = len({model.family_of(k) for k in series})
    files[render.MANIFEST] = render.manifest({"sessions": len(window.sessions), "history_sessions": window.total,
                                              "metrics": len(series), "families": families, "change_points": found,
                                              "latest": window.latest, "source": redact(options.target)})
    seconds["render"] = time.perf_counter() - clock
    clock = time.perf_counter()
    progress(f"writing {len(files)} files to {options.out}")
    try:
        write_site(options.out, files)
    except OSError as exc:
        raise DashboardError(f"cannot write the dashboard to {options.out}: {exc.strerror or exc}") from None
    seconds["write"] = time.perf_counter() - clock
    return Built(out=options.out, shown=len(window.sessions), total=window.total, metrics=len(series),
                 families=families, change_points=found, seconds=seconds)


def guarded(options: Options, progress: Callable[[str], None]) -> Built:
    """`build`, with a history that cannot be opened or read turned into a `DashboardError`."""
    try:
        return build(options, progress)
    except HistoryError as exc:
        raise DashboardError(str(exc)) from None
