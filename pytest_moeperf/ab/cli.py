"""``moeperf ab [options] [-- pytest args…]``: base against head on the same box, interleaved and paired.

Exit status: 0 no metric REGRESSED (and no test failed); 1 a metric REGRESSED or a test failed on a side; 2 bad
input (an option, sides that do not differ, a side that cannot run pytest, pytest arguments that select nothing or
that moeperf ab refuses); 3 a side's session crashed (its output is shown); 130 interrupted (Ctrl-C, or SIGINT from
a job's time limit: the complete pairs so far are judged and the reports written, saying so; before the first
complete pair nothing is); 143 terminated (SIGTERM: the same as an interruption, reported as a termination). Either
way the running child tears its fixtures down and is stopped with its processes, the servers are stopped, and the
temporary worktrees and directories are removed; a child whose ``moeperf ab`` was killed (SIGKILL) is interrupted by
the parent-death signal (`processes.termination`), and the next run removes the killed run's folder and worktrees
(`ab.workdir`).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import random
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from pytest_moeperf.ab import adaptive, calibration, paired, report, workdir
from pytest_moeperf.ab.runner import Runner, SideFailed, merged
from pytest_moeperf.ab.servers import ServerError, Servers, fit_twice
from pytest_moeperf.ab.sides import (
    BASE,
    HEAD,
    Checkouts,
    Side,
    SideError,
    SideSpec,
    facts_of,
    parse_env,
    parse_python,
)
from pytest_moeperf.ab.verdicts import Outcome
from pytest_moeperf.judging.verdict import Status
from pytest_moeperf.ledger import Ledger
from pytest_moeperf.processes.termination import EXIT_TERMINATED, Terminated, sigterm_interrupts
from pytest_moeperf.settings.checks import at_least, describe, output_path, pvalue
from pytest_moeperf.store import files

DEFAULT_PAIRS = 10  # as Pinpoint's first attempts; then one more look at 20 (alpha 0.025 a look)
DEFAULT_MAX_PAIRS = 20
EXIT_REGRESSED, EXIT_USAGE, EXIT_SIDE, EXIT_INTERRUPTED = 1, 2, 3, 130

#: pytest arguments a side's session must not get, and why
REFUSED = {
    "--moeperf-update": "the sides must not update baselines (record them with a normal run)",
    "--moeperf-rounds": "a side's process is the unit of moeperf ab: use --pairs and --max-pairs",
    "--moeperf-history": "the sides write no history (moeperf ab runs them with --moeperf-history off)",
    "--moeperf-report": "use moeperf ab --report: one report of both sides",
    "--moeperf-markdown": "use moeperf ab --markdown: one summary of both sides",
    "--moeperf-html": "use moeperf ab --html: one report of both sides",
}
#: pytest arguments that name a server, which --serve names for each side
SERVED = ("--moeperf-server-url", "--moeperf-server-pid")
#: why --serve-reuse's verdicts cover two server starts, not the sides in general (lent 1x H200s, vLLM 0.26: two
#: consecutive starts of one profile served c=1 at engine TPOT 2.03 and 2.32 ms on one host, 3.4 % apart on another)
ONE_START_NOTE = ("moeperf ab: one server a side for the whole run (--serve-reuse): a difference between the two "
                  "server starts (up to 14 % seen on 1x H200) reads as the sides' difference; without --serve-reuse "
                  "every pair has its own starts")
#: what makes the sides differ
SIDE_OPTIONS = ("Name what differs with --base-ref/--head-ref REF, --base-python/--head-python PATH or "
                "--base-env/--head-env KEY=VALUE")
APART_NOTE = ("moeperf ab: two servers of the profile do not fit on this box at once: each process had a fresh "
              "server of its own side, started just before it")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="moeperf ab", usage="moeperf ab [options] [-- pytest args...]",
        description="Run the same pytest session on two sides (interpreter, environment, git revision) in "
                    "randomized ABBA blocks of separate processes on this box, and judge each metric on the pairs.",
        epilog="Arguments after -- go to pytest on both sides (tests, -k, --moeperf-tolerance, -p plugins). Exit "
               "status: 0 no regression, 1 a metric regressed or a test failed, 2 bad input (sides that do not "
               "differ included: --aa runs one side twice), 3 a side's session "
               "crashed, 130 interrupted, 143 terminated by SIGTERM (either way the complete pairs are judged and "
               "written).")
    for side in (BASE, HEAD):
        parser.add_argument(f"--{side}-python", metavar="PATH", type=parse_python,
                            help=f"the {side} side's interpreter or virtual environment (default: this interpreter)")
        parser.add_argument(f"--{side}-env", metavar="KEY=VALUE", type=parse_env, action="append", default=[],
                            help=f"set an environment variable on the {side} side (repeatable)")
        parser.add_argument(f"--{side}-ref", metavar="REF",
                            help=f"run the {side} side in a temporary git worktree of this revision "
                                 "(default: this checkout as it is)")
    parser.add_argument("--serve", metavar="PROFILE",
                        help="serve PROFILE's vLLM server on each side (moeperf serve, under the side's interpreter, "
                             "environment and checkout) and attach the side's children to it: both sides' servers "
                             "started afresh, at the same time where two fit on the box, before every pair, so that "
                             "each pair stands for its own two server starts (a difference between starts is noise "
                             "between pairs, not an offset read as the sides' difference)")
    reuse = parser.add_mutually_exclusive_group()
    reuse.add_argument("--serve-reuse", action="store_true",
                       help="with --serve: one server a side for the whole run (both up at once), a start a side "
                            "instead of a start a pair; the verdicts then cover those two starts")
    reuse.add_argument("--serve-fresh", action="store_true",
                       help="with --serve: a fresh start a pair (the default; kept for scripts that name it)")
    parser.add_argument("--aa", action="store_true",
                        help="A/A calibration: run the base side twice; reports the false-alarm rate and each "
                             "metric's noise, and names metrics noisier than their minimum effect")
    parser.add_argument("--pairs", type=at_least(1), default=DEFAULT_PAIRS, metavar="N",
                        help="pairs to run before the first look (default: %(default)s)")
    parser.add_argument("--max-pairs", type=at_least(1), default=DEFAULT_MAX_PAIRS, metavar="N",
                        help="the pair budget: while a metric can still be decided, twice as many pairs at each "
                             "next look, up to N (default: %(default)s)")
    parser.add_argument("--alpha", type=pvalue, default=paired.ALPHA, metavar="A",
                        help="false-discovery rate over the metrics and the looks; each look tests and draws its "
                             "intervals at A / looks (default: %(default)s)")
    parser.add_argument("--seed", type=at_least(0), metavar="N", help="seed of the block orders (default: random, "
                        "printed and reported)")
    parser.add_argument("--report", type=output_path, metavar="PATH", help="write the JSON report to PATH")
    parser.add_argument("--markdown", type=output_path, metavar="PATH",
                        help="append the Markdown summary to PATH (e.g. $GITHUB_STEP_SUMMARY)")
    parser.add_argument("--html", type=output_path, metavar="PATH", help="write the HTML report to PATH")
    parser.add_argument("--junitxml", type=output_path, metavar="PATH", help="write JUnit XML to PATH")
    parser.add_argument("-q", "--quiet", action="store_true", help="do not echo the sides' pytest progress lines")
    return parser


def split(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """``moeperf ab``'s own arguments and the pytest arguments (after the first ``--``)."""
    args = list(argv)
    if "--" in args:
        at = args.index("--")
        return args[:at], args[at + 1:]
    return args, []


def problems(args: argparse.Namespace, pytest_args: Sequence[str]) -> list[str]:
    """What is wrong with the arguments, each naming the option."""
    out = []
    if args.max_pairs < args.pairs:
        out.append(f"--max-pairs {args.max_pairs} is below --pairs {args.pairs}")
    level = adaptive.alpha_per_look(args.alpha, args.pairs, args.max_pairs)
    needed = paired.min_pairs(level)
    if args.max_pairs < needed:
        out.append(f"--max-pairs {args.max_pairs}: the signed-rank test needs at least {needed} pairs to decide "
                   f"at --alpha {args.alpha:g} over {len(adaptive.looks(args.pairs, args.max_pairs))} look(s) "
                   f"({level:.3g} a look)")
    for flag in ("serve_fresh", "serve_reuse"):
        if getattr(args, flag) and not args.serve:
            out.append(f"--{flag.replace('_', '-')} is about the servers of --serve: name a profile with --serve "
                       "PROFILE")
    if args.aa:
        given = [f"--head-{what}" for what in ("python", "env", "ref") if getattr(args, f"head_{what}")]
        if given:
            out.append(f"--aa runs the base side twice: {', '.join(given)} does not apply")
    for arg in pytest_args:
        flag = arg.split("=", 1)[0]
        if flag in REFUSED:
            out.append(f"pytest argument {flag}: {REFUSED[flag]}")
        if args.serve and flag in SERVED:
            out.append(f"pytest argument {flag}: --serve gives each side its own server")
    return out


def _specs(args: argparse.Namespace) -> tuple[SideSpec, SideSpec]:
    def spec(side: str) -> SideSpec:
        return SideSpec(side, getattr(args, f"{side}_python"), tuple(getattr(args, f"{side}_env")),
                        getattr(args, f"{side}_ref"))

    return spec(BASE), spec(HEAD)


def _say(text: str) -> None:
    print(text, flush=True)


def _fail(text: str) -> None:
    print(f"moeperf ab: {text}", file=sys.stderr, flush=True)


def main_ab(argv: Sequence[str]) -> int:
    # Ctrl-C must reach us even when a script started us as a background job (SIGINT ignored then)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    with sigterm_interrupts():  # SIGTERM: as Ctrl-C, exit 143
        return _main_ab(argv)


def _main_ab(argv: Sequence[str]) -> int:
    own, pytest_args = split(argv)
    parser = build_parser()
    args = parser.parse_args(own)
    found = problems(args, pytest_args)
    if found:
        parser.error("; ".join(found))
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**31)
    started = dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat()
    base_spec, head_spec = _specs(args)
    stopped: KeyboardInterrupt | None = None
    notes: list[str] = []
    try:
        for line in workdir.sweep():  # what runs killed with SIGKILL left
            _say(line)
        with workdir.made() as tmp, Checkouts(Path.cwd(), tmp / workdir.WORKTREES) as checkouts:
            try:
                same = None if args.aa else checkouts.same(base_spec, head_spec)
                if same is not None:
                    raise SideError(f"the two sides are the same ({same}): the run would compare them with "
                                    f"themselves. {SIDE_OPTIONS}, or run the A/A calibration with --aa")
                base = checkouts.prepare(base_spec)
                head = base if args.aa else checkouts.prepare(head_spec)
            except SideError as exc:
                _fail(str(exc))
                return EXIT_USAGE
            _say(f"moeperf ab: {base.describe()}")
            _say(f"moeperf ab: {'head: the base side again (A/A)' if args.aa else head.describe()}")
            schedule = adaptive.looks(args.pairs, args.max_pairs)
            _say(f"moeperf ab: looks at {', '.join(map(str, schedule))} pairs (alpha {args.alpha:g} / "
                 f"{len(schedule)} a look); seed {seed}")
            baselines = tmp / "baselines"
            baselines.mkdir()
            with contextlib.ExitStack() as stack:
                side_args: dict[str, list[str]] = {}
                before: Callable[[str, bool, bool], dict[str, list[str]]] | None = None
                if args.serve:
                    together = fit_twice(args.serve, base.cwd) is not False
                    if args.serve_reuse and not together:
                        _fail(f"--serve-reuse keeps both sides' servers up at once: two servers of {args.serve} do "
                              "not fit on this box (leave it out: a fresh server a process)")
                        return EXIT_USAGE
                    if not together:
                        notes.append(APART_NOTE)
                    servers = stack.enter_context(Servers(args.serve, {BASE: base, HEAD: head}, tmp, _say,
                                                          fresh=not args.serve_reuse, together=together))
                    side_args = servers.side_args()
                    before = servers.before
                runner = Runner({BASE: base, HEAD: head}, pytest_args, baselines, tmp, seed, _say,
                                progress=not args.quiet, side_args=side_args, before=before)
                try:
                    outcomes, found = adaptive.run(runner, args.pairs, args.max_pairs, args.alpha, _say)
                except KeyboardInterrupt as exc:
                    partial = adaptive.interrupted(runner, args.pairs, args.max_pairs, args.alpha, _how(exc))
                    if partial is None:
                        raise
                    (outcomes, found), stopped = partial, exc
                notes += found
    except ServerError as exc:
        _fail(f"{exc}\nnothing written")
        return EXIT_SIDE
    except KeyboardInterrupt as exc:
        _fail(f"{_how(exc)} before a pair was complete: nothing written")
        return _interrupted_exit(exc)
    except SideFailed as exc:
        output = (exc.result.stdout + exc.result.stderr).splitlines()
        print("\n".join(output[-80:]), flush=True)
        if exc.bad_arguments:
            _fail(f"{exc}: the pytest arguments after -- select no test or are wrong: nothing written")
            return EXIT_USAGE
        _fail(f"{exc}: nothing written")
        return EXIT_SIDE
    if not outcomes:
        _fail("the selected tests recorded no metric (perf.record): nothing to compare")
        return EXIT_USAGE
    if args.serve and args.serve_reuse:
        notes = [*notes, ONE_START_NOTE]
    base = dataclasses.replace(base, facts=facts_of(base, runner.first_document(BASE)))
    head = dataclasses.replace(head, facts=facts_of(head, runner.first_document(HEAD)))
    done = conclude(args, runner, outcomes, notes, base, head, seed, started, stopped is not None)
    return done if stopped is None else _interrupted_exit(stopped)


def _how(exc: KeyboardInterrupt) -> str:
    return "terminated (SIGTERM)" if isinstance(exc, Terminated) else "interrupted"


def _interrupted_exit(exc: KeyboardInterrupt) -> int:
    return EXIT_TERMINATED if isinstance(exc, Terminated) else EXIT_INTERRUPTED


def _ledger(runner: Runner, outcomes: dict[str, Outcome]) -> Ledger:
    ledger = merged(runner.processes)
    for key, outcome in outcomes.items():
        if key in ledger.records:
            ledger.records[key] = dataclasses.replace(ledger.records[key], threshold=outcome.verdict.threshold,
                                                      verdict=outcome.verdict)
    return ledger


def conclude(args: argparse.Namespace, runner: Runner, outcomes: dict[str, Outcome], notes: list[str], base: Side,
             head: Side, seed: int, started: str, interrupted: bool = False) -> int:
    """Sections, reports and the exit status, from the judged run."""
    ledger = _ledger(runner, outcomes)
    level = adaptive.alpha_per_look(args.alpha, args.pairs, args.max_pairs)
    ledger.sections.append(report.pairs_section(outcomes, level))
    ledger.sections.append(report.sides_section(base, head, args.aa))
    cal = calibration.calibrate(outcomes, level) if args.aa else None
    if cal is not None:
        if cal.named:
            ledger.sections.append(calibration.section(cal))
        notes = [*calibration.lines(cal), *notes]
    failures = [f"{p.label}: {line}" for p in runner.processes for line in p.failures]
    notes += [f"moeperf ab: test failed in {line}" for line in failures]
    head_line = report.header(base, head, args.aa, runner.pairs, runner.blocks, seed)
    facts = {"mode": "A/A" if args.aa else "A/B", "started": started, "interrupted": interrupted, "seed": seed,
             "alpha": args.alpha,
             "looks": adaptive.looks(args.pairs, args.max_pairs), "alpha_per_look": level,
             "pairs": runner.pairs, "blocks": runner.blocks, "first_pairs": args.pairs, "max_pairs": args.max_pairs,
             "processes": [{"label": p.label, "pair": p.pair, "block": p.block, "seconds": round(p.seconds, 3),
                            "failures": list(p.failures)} for p in runner.processes],
             "calibration": None if cal is None else cal.to_json(), "notes": list(notes)}
    written, errors = write(args, ledger, report.report_document(ledger, runner.first_document(HEAD),
                            report.ab_facts(outcomes, base, head, facts)), head_line, notes)
    _say(" moeperf ab ".center(80, "="))
    for text in report.terminal_lines(ledger, head_line, notes):
        _say(text)
    for path in written:
        _say(f"wrote {path}")
    for error in errors:
        _fail(error)
    regressed = sum(v.status is Status.REGRESSED for v in ledger.verdicts)
    return EXIT_REGRESSED if regressed or failures else 0


def write(args: argparse.Namespace, ledger: Ledger, doc: dict[str, object], head_line: str, notes: list[str]
          ) -> tuple[list[Path], list[str]]:
    """Write the reports asked for; the paths written and the errors (a report that cannot be written is said,
    the verdicts stand)."""
    written, errors = [], []

    def put(path: Path, text: str, append: bool = False) -> None:
        try:
            files.write_report(path, text, append)
            written.append(path)
        except OSError as exc:
            errors.append(f"could not write {path}: {describe(exc)}")

    if args.report is not None:
        put(args.report, report.dumps(doc))
    if args.markdown is not None:
        put(args.markdown, report.markdown_text(ledger, head_line, notes), append=True)
    if args.junitxml is not None:
        put(args.junitxml, report.junit_xml(ledger.verdicts))
    if args.html is not None:
        from pytest_moeperf.history.plugin import write_html

        if write_html(args.html, doc):
            written.append(args.html)
        else:
            errors.append(f"HTML report not written to {args.html} (see the warning above)")
    return written, errors
