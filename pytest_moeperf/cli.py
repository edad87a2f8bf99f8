"""The ``moeperf`` command: ``topology``, ``baselines diff``, ``baselines merge``, ``budget``, ``ab``, ``batch``
(and the wings' ``history``, ``trend``, ``dashboard``, ``attribute``, ``serve``)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from pytest_moeperf.history import cli as history_cli
from pytest_moeperf.machine import probe, topology
from pytest_moeperf.reports import markdown
from pytest_moeperf.settings.checks import describe, output_path, parse_noise_runs, parse_seconds
from pytest_moeperf.store import baselines, files, trees


def _json_target(text: str) -> str:
    """``--json``'s PATH: ``-`` (stdout) or a writable file path."""
    return text if text == "-" else str(output_path(text))


def _need_dir(path: Path) -> None:
    """A baselines directory that is missing or a file is named as such (before anything is read)."""
    if path.exists() and not path.is_dir():
        raise baselines.BaselineError(f"baselines directory {path} is a file, not a directory")


def _topology(args: argparse.Namespace) -> int:
    try:
        topo = topology.load_topology(args.topology) if args.topology else probe.probe()
    except topology.TopologyError as exc:
        print(f"moeperf topology: {exc}", file=sys.stderr)
        return 2
    if args.json is not None:
        text = json.dumps(topo.to_json(), indent=2, sort_keys=True) + "\n"
        if args.json == "-":
            sys.stdout.write(text)
        else:
            try:
                files.atomic_write(Path(args.json), text)
            except OSError as exc:
                print(f"moeperf topology: cannot write {args.json}: {describe(exc)}", file=sys.stderr)
                return 2
            print(f"wrote {args.json} ({topo.fingerprint.slug})")
        return 0
    print("\n".join(topology.render(topo)))
    return 0


def _git_tree(root: Path, rev: str) -> dict[str, str]:
    """``{"<slug>/<suite>": text}`` of the baseline files under ``root`` at git revision ``rev``."""
    top = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=root, capture_output=True, text=True)
    if top.returncode != 0:
        raise baselines.BaselineError(f"{root} is not inside a git checkout: pass --old DIR instead")
    rel = root.resolve().relative_to(Path(top.stdout.strip()).resolve())
    listed = subprocess.run(["git", "ls-tree", "-r", "--name-only", rev, "--", str(rel)], cwd=top.stdout.strip(),
                            capture_output=True, text=True)
    if listed.returncode != 0:
        raise baselines.BaselineError(f"git ls-tree {rev}: {listed.stderr.strip()}")
    texts: dict[str, str] = {}
    for name in listed.stdout.splitlines():
        path = Path(name)
        if path.suffix == ".json" and len(path.relative_to(rel).parts) == 2:
            shown = subprocess.run(["git", "show", f"{rev}:{name}"], cwd=top.stdout.strip(), capture_output=True,
                                   text=True, check=True)
            texts[f"{path.parent.name}/{path.stem}"] = shown.stdout
    return texts


def _merge(args: argparse.Namespace) -> int:
    into, sources = Path(args.into), [Path(s) for s in args.sources]
    try:
        for root in (into, *sources):
            _need_dir(root)
        written = trees.merge_trees(into, sources, args.keep, args.lock_timeout,
                                    lambda line: print(f"moeperf baselines merge: {line}", file=sys.stderr, flush=True))
    except (baselines.BaselineError, OSError, ValueError) as exc:
        print(f"moeperf baselines merge: {describe(exc)}", file=sys.stderr)
        return 2
    for path in written:
        print(f"merged {path}")
    if not written:
        print(f"{into} is up to date: nothing to merge")
    return 0


def diff_markdown(changes: Sequence[trees.Change], title: str) -> list[str]:
    lines = [f"## Baseline changes: {markdown.md_text(title)}", ""]
    if not changes:
        return lines + ["No baseline changed."]
    counts = {k: sum(1 for c in changes if c.kind == k) for k in ("changed", "added", "removed")}
    lines += [", ".join(f"{n} {k}" for k, n in counts.items() if n), ""]
    rows = [(c.file, markdown.Code(c.key.split('::', 1)[-1]), c.kind, "-" if c.old is None else f"{c.old:.4g}",
             "-" if c.new is None else f"{c.new:.4g}", c.unit,
             "-" if c.relative is None else f"{c.relative * 100:+.1f} %") for c in changes]
    return lines + markdown.markdown_table(("fingerprint/suite", "metric", "what", "before", "after", "unit", "Δ"),
                                         rows)


def _diff(args: argparse.Namespace) -> int:
    root = Path(args.baselines)
    try:
        _need_dir(root)
        new = trees.load_tree(root)
        if args.old:
            _need_dir(Path(args.old))
            old = trees.load_tree(Path(args.old))
            title = f"{args.old} → {root}"
        else:
            old = trees.parse_tree_texts(_git_tree(root, args.rev))
            title = f"{args.rev} → working tree"
    except subprocess.CalledProcessError as exc:
        print(f"moeperf baselines diff: git show at {args.rev}: {describe(exc)}", file=sys.stderr)
        return 2
    except (baselines.BaselineError, OSError, ValueError) as exc:
        print(f"moeperf baselines diff: {describe(exc)}", file=sys.stderr)
        return 2
    print("\n".join(diff_markdown(trees.diff_trees(old, new), title)))
    return 0


def _budget(argv: list[str]) -> int:
    from pytest_moeperf.kernels.budget.cli import main_budget

    return main_budget(argv)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="moeperf", description="MoE inference performance regression tools")
    sub = parser.add_subparsers(dest="command", required=True)
    topo = sub.add_parser("topology", help="print this machine's GPUs, links and fingerprint")
    topo.add_argument("--topology", metavar="FILE", help="read a topology file (or bundled name) instead of probing")
    topo.add_argument("--json", nargs="?", const="-", metavar="PATH", type=_json_target,
                      help="write the topology file format (to PATH, or stdout) that --moeperf-topology reads")
    topo.set_defaults(func=_topology)
    base = sub.add_parser("baselines", help="inspect stored baselines")
    base_sub = base.add_subparsers(dest="action", required=True)
    diff = base_sub.add_parser("diff", help="what an update changed, as Markdown")
    diff.add_argument("--baselines", default="baselines", metavar="DIR",
                      help="baselines directory (default: %(default)s)")
    diff.add_argument("--rev", default="HEAD", help="git revision to compare against (default: %(default)s)")
    diff.add_argument("--old", metavar="DIR", help="compare against another baselines directory instead of git")
    diff.set_defaults(func=_diff)
    merge = base_sub.add_parser("merge", help="merge baselines updated apart (other runners, other machines) "
                                "into one directory: each metric keeps the union of its runs")
    merge.add_argument("sources", nargs="+", metavar="SRC", help="baselines directories to merge in")
    merge.add_argument("--into", default="baselines", metavar="DIR", help="the directory merged into, also read "
                       "(default: %(default)s)")
    merge.add_argument("--keep", type=parse_noise_runs, default=baselines.DEFAULT_KEEP_RUNS, metavar="N",
                       help="runs kept per metric and host, newest; at least 3 (default: %(default)s)")
    merge.add_argument("--lock-timeout", type=parse_seconds, default=files.DEFAULT_LOCK_TIMEOUT_S, metavar="SECONDS",
                       help="give up after waiting this long for the lock an update or another merge holds (its "
                       "holder is named while waiting; default: %(default)g)")
    merge.set_defaults(func=_merge)
    sub.add_parser("budget", help="decode-step time budget from measured GEMMs and all-reduces", add_help=False)
    history_cli.add_subcommands(sub)
    sub.add_parser("attribute", help="per-component decode-step time from a vLLM profiler trace", add_help=False)
    sub.add_parser("serve", help="start the vLLM server a serve profile describes, until interrupted",
                   add_help=False)
    sub.add_parser("ab", help="base against head on this box: interleaved pytest processes, judged paired",
                   add_help=False)
    sub.add_parser("dashboard", help="a static perf dashboard (HTML) of a history: every metric's series, change "
                   "points and verdicts per host", add_help=False)
    sub.add_parser("batch", help="the perf suites of this checkout in one command: steps, rounds, update and A/A, "
                   "a time budget, outputs in one folder", add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list[:1] == ["budget"]:
        return _budget(args_list[1:])
    if args_list[:1] == ["attribute"]:
        from pytest_moeperf.attribution.cli import main_attribute

        return main_attribute(args_list[1:])
    if args_list[:1] == ["ab"]:
        from pytest_moeperf.ab.cli import main_ab

        return main_ab(args_list[1:])
    if args_list[:1] == ["serve"]:
        from pytest_moeperf.serving.cli import main_serve

        return main_serve(args_list[1:])
    if args_list[:1] == ["dashboard"]:
        from pytest_moeperf.dashboard.cli import main_dashboard

        return main_dashboard(args_list[1:])
    if args_list[:1] == ["batch"]:
        from pytest_moeperf.batch.cli import main_batch

        return main_batch(args_list[1:])
    args = build_parser().parse_args(args_list)
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
