"""``moeperf history [list | show METRIC… | upgrade]`` and ``moeperf trend METRIC…``: the runs in a history, a metric's
series, and the change points in it (with ``--plot``, pictures of them)."""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from pytest_moeperf.history.plugin import HISTORY_DIR, HISTORY_FILE
from pytest_moeperf.history.records import Point
from pytest_moeperf.history.store import SCHEMA_VERSION, HistoryError, HistoryStore, match_keys
from pytest_moeperf.history.targets import is_postgresql, redact
from pytest_moeperf.history.trend import MAX_PVALUE, MIN_MAGNITUDE, WINDOW, split_by_fingerprint
from pytest_moeperf.settings.checks import at_least, describe, output_path, parse_fraction, pvalue

ENV = "MOEPERF_HISTORY"


def default_target() -> str:
    return os.environ.get(ENV) or str(Path(HISTORY_DIR) / HISTORY_FILE)


def table(columns: Sequence[str], rows: Sequence[Sequence[object]]) -> list[str]:
    cells = [[str(c) for c in row] for row in rows]
    widths = [max([len(columns[i])] + [len(r[i]) for r in cells]) for i in range(len(columns))]

    def line(row: Sequence[str]) -> str:
        return "  ".join(c.ljust(widths[i]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(row)).rstrip()

    head = line(columns)
    return [head, "-" * len(head)] + [line(r) for r in cells]


def _target(args: argparse.Namespace) -> str:
    return checked(getattr(args, "db", None) or default_target())


def checked(target: str) -> str:
    """``target`` when it names a history at all (a URL of another scheme does not)."""
    scheme = re.match(r"([A-Za-z][A-Za-z0-9+.-]*)://", target)
    if not is_postgresql(target) and scheme and scheme.group(1) != "sqlite":
        raise HistoryError(f"{redact(target)}: a history is a SQLite path (or sqlite:///PATH) or a "
                           f"postgresql:// URL, not {scheme.group(1)}://")
    return target


def _open(args: argparse.Namespace) -> HistoryStore:
    return open_history(_target(args))


def open_history(target: str) -> HistoryStore:
    """An existing history, to read (`HistoryStore.read`): read-only, never created nor migrated."""
    return HistoryStore.read(checked(target))


def _commit(point: Point) -> str:
    run = point.run.run
    return (run.git_commit or "-")[:10] + ("+" if run.git_dirty else "")


def list_lines(store: HistoryStore, fingerprint: str | None, limit: int | None) -> list[str]:
    runs = store.runs(fingerprint, limit)
    rows = [(f"#{r.id}", r.run.finished, (r.run.git_commit or "-")[:10] + ("+" if r.run.git_dirty else ""),
             r.run.fingerprint, r.run.host or "-", r.metrics, r.regressed) for r in runs]
    return [f"{len(runs)} run(s) in {redact(store.target)}"] + table(
        ("run", "finished (UTC)", "commit", "fingerprint", "host", "metrics", "regressed"), rows)


def show_lines(store: HistoryStore, patterns: Sequence[str], fingerprint: str | None) -> list[str]:
    lines: list[str] = []
    for key in match_keys(store.keys(), patterns):
        for slug, points in split_by_fingerprint(store.series(key, fingerprint)).items():
            unit = points[0].metric.unit
            rows = [(f"#{p.run.id}", p.run.run.finished, _commit(p), f"{p.metric.median:.4g}", p.metric.n,
                     f"{p.metric.iqr:.3g}", "-" if p.metric.baseline is None else f"{p.metric.baseline:.4g}",
                     "-" if p.metric.change is None else f"{p.metric.change * 100:+.1f} %", p.metric.status)
                    for p in points]
            lines += [f"{key} on {slug} ({unit}, {points[0].metric.better} is better)"]
            lines += table(("run", "finished (UTC)", "commit", "median", "n", "IQR", "baseline", "Δ", "verdict"),
                           rows) + [""]
    return lines


def _history(args: argparse.Namespace) -> int:
    if args.action == "upgrade":
        target = _target(args)
        before, after = HistoryStore.upgrade(target)
        print(f"history {redact(target)}: schema {before}" + (f" upgraded to {after}" if after != before else
                                                                f", current (this moeperf's is {SCHEMA_VERSION})"))
        return 0
    with _open(args) as store:
        if args.action == "show":
            lines = show_lines(store, args.metrics, _fingerprint(args))
            if not lines:
                print(f"moeperf history: no metric matches {_wanted(args)}", file=sys.stderr)
                return 2
        else:
            lines = list_lines(store, _fingerprint(args), getattr(args, "limit", None))
    print("\n".join(lines).rstrip())
    return 0


def _fingerprint(args: argparse.Namespace) -> str | None:
    """``--fingerprint``, given before or after the action (each parser has its own, defaulting to nothing)."""
    found: str | None = getattr(args, "fingerprint", None)
    return found


def plot_path(base: Path, key: str, fingerprint: str, many: bool) -> Path:
    """``--plot PATH`` itself for one trend; for several, the key and fingerprint go into each file's name."""
    if not many:
        return base
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", f"{key}-{fingerprint}").strip("_")[-120:]
    return base.with_name(f"{base.stem}-{name}{base.suffix or '.png'}")


def _wanted(args: argparse.Namespace) -> str:
    where = f" in the runs of fingerprint {_fingerprint(args)}" if _fingerprint(args) else ""
    return " ".join(args.metrics) + where


def _trend(args: argparse.Namespace) -> int:
    from pytest_moeperf.history import plots, trend

    fmt = "png" if args.plot is None else (args.plot.suffix.lstrip(".") or "png").lower()
    if fmt not in plots.FORMATS:  # before any history is read
        print(f"moeperf trend: --plot wants a .png or .svg path, got {args.plot}", file=sys.stderr)
        return 2

    with _open(args) as store:
        found = trend.trends(store, args.metrics, _fingerprint(args), args.max_pvalue, args.min_magnitude,
                             args.window)
    if not found:
        print(f"moeperf trend: no metric matches {_wanted(args)}", file=sys.stderr)
        return 2
    lines: list[str] = []
    for item in found:
        lines += trend.step_lines(item)
    if args.plot is not None:
        for item in found:
            path = plot_path(args.plot, item.key, item.fingerprint, len(found) > 1)
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(plots.trend_plot(item, fmt))
            except OSError as exc:
                print(f"moeperf trend: cannot write {path}: {describe(exc)}", file=sys.stderr)
                return 2
            lines.append(f"wrote {path}")
    print("\n".join(lines))
    return 0


def _guarded(handler: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """A history that cannot be opened or read is a message and exit status 2, not a traceback."""

    def run(args: argparse.Namespace) -> int:
        try:
            return handler(args)
        except HistoryError as exc:
            print(f"moeperf {args.command}: {describe(exc)}", file=sys.stderr)
            return 2

    return run


def _common() -> argparse.ArgumentParser:
    """``--db`` and ``--fingerprint``, a fresh pair for each parser: ``parents=`` shares the very action objects,
    so a default set on one parser (``set_defaults``) would overwrite a value given to another (issue 37)."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--db", default=argparse.SUPPRESS, metavar="URL|PATH",
                        help=f"history database: a SQLite path or postgresql://… URL (default: ${ENV}, "
                             f"else {HISTORY_DIR}/{HISTORY_FILE})")
    common.add_argument("--fingerprint", default=argparse.SUPPRESS, metavar="SLUG|HASH",
                        help="only runs of this machine fingerprint")
    return common


def add_subcommands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``history`` and ``trend`` to the ``moeperf`` command's subparsers."""
    history = sub.add_parser("history", parents=[_common()], help="runs in the perf history and a metric's series")
    actions = history.add_subparsers(dest="action")
    listing = actions.add_parser("list", parents=[_common()], help="the runs, oldest first (the default action)")
    listing.add_argument("--limit", type=at_least(1), metavar="N", help="only the last N runs")
    show = actions.add_parser("show", parents=[_common()], help="each named metric's value per run")
    show.add_argument("metrics", nargs="+", metavar="METRIC", help="test_id::metric, a glob, or a substring")
    actions.add_parser("upgrade", parents=[_common()],
                       help=f"migrate the history's schema to this moeperf's ({SCHEMA_VERSION}); reads never do")
    history.set_defaults(func=_guarded(_history), action="list")
    trend = sub.add_parser("trend", parents=[_common()], help="change points in metrics' histories (Apache Otava)")
    trend.add_argument("metrics", nargs="+", metavar="METRIC", help="test_id::metric, a glob, or a substring")
    trend.add_argument("--plot", type=output_path, metavar="PATH",
                       help="draw each trend to PATH (.png or .svg; several: the metric goes into each name)")
    trend.add_argument("--max-pvalue", type=pvalue, default=MAX_PVALUE, metavar="P",
                       help="significance of a change point (default: %(default)s)")
    trend.add_argument("--min-magnitude", type=parse_fraction, default=MIN_MAGNITUDE, metavar="FRAC",
                       help="smallest relative step reported, a fraction (0.05) or a percentage (5%%) "
                            "(default: %(default)s)")
    trend.add_argument("--window", type=at_least(2), default=WINDOW, metavar="RUNS",
                       help="sliding window of the split step, in runs (default: %(default)s)")
    trend.set_defaults(func=_guarded(_trend))


def main(argv: Sequence[str] | None = None) -> int:
    """Standalone entry (``python -m pytest_moeperf.history.cli``); ``moeperf`` itself wires `add_subcommands`."""
    parser = argparse.ArgumentParser(prog="moeperf", description="perf history and change points")
    add_subcommands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
