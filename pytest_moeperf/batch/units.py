"""Each kind of batch unit as commands: the probe, a pytest session over suites, a served profile attributed, the
budget tables. Time: a unit that takes time (a pytest run, an attribution) gets an equal share of what is left of
the batch's deadline among the timed units still to run (less a minute for the budget tables when they follow)."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pytest_moeperf.batch.facts import Facts
from pytest_moeperf.batch.plan import Attribution, Budget, PytestRun, Topology, Unit
from pytest_moeperf.batch.runner import Batch, StepResult
from pytest_moeperf.ledger import DEADLINE_SKIP, Ledger
from pytest_moeperf.processes.lifecycle import log_tail
from pytest_moeperf.reports.document import ledger_of

__all__ = ["Context", "run_unit"]

#: kept for the budget tables when they come after the timed units
BUDGET_RESERVE_S = 60.0
#: a pytest round whose --moeperf-deadline would be shorter than this is not started
MIN_ROUND_S = 30.0
#: how many of the tests a deadline skipped a step's detail names
NAMED = 3
#: the cross-check's windows: (concurrency, prompts)
CROSSCHECK = ((1, 40), (16, 160))


@dataclass(frozen=True)
class Context:
    """What every unit needs besides the batch: the interpreter and its facts, where baselines and models are."""

    python: str
    facts: Facts
    baselines: Path
    model_cache: Path
    profiles: tuple[Path, ...]
    budget_args: tuple[str, ...]
    budget_target: tuple[str, ...]


def _moeperf(ctx: Context, *args: str) -> list[str]:
    return [ctx.python, "-m", "pytest_moeperf.cli", *args]


def _share(batch: Batch, units_left: Sequence[Unit]) -> float | None:
    """This unit's share of the time left (None: no deadline)."""
    left = batch.left()
    if left is None:
        return None
    timed = sum(isinstance(u, PytestRun | Attribution) for u in units_left)
    reserve = BUDGET_RESERVE_S if any(isinstance(u, Budget) for u in units_left) else 0.0
    return (left - reserve) / max(1, timed)


def _topology(batch: Batch, ctx: Context, result: StepResult) -> None:
    text, js = batch.out / "topology.txt", batch.out / "topology.json"
    outcome = batch.run(_moeperf(ctx, "topology"), text, until=None, grace_s=10.0)
    batch.run(_moeperf(ctx, "topology", "--json", str(js)), text, until=None, grace_s=10.0)
    result.status, result.detail = outcome.status, outcome.describe()
    result.outputs += [batch.output(p) for p in (text, js) if p.exists()]


def pytest_argv(run: PytestRun, ctx: Context, report: Path, deadline_s: float | None) -> list[str]:
    plugin = () if ctx.facts.entry_point else ("-p", "pytest_moeperf.plugin")
    argv = [ctx.python, "-m", "pytest", *plugin, *run.paths, "-p", "no:cacheprovider", "-q", "-ra",
            f"--moeperf-baselines={ctx.baselines}", f"--moeperf-report={report}"]  # '=': see `store.keys`
    if run.update:
        argv.append("--moeperf-update")
    if run.rounds > 1:
        argv += ["--moeperf-rounds", str(run.rounds)]
    if deadline_s is not None:
        argv += ["--moeperf-deadline", f"{deadline_s:.0f}"]
    if run.keyword:
        argv += ["-k", run.keyword]
    return [*argv, *run.args]


def _pytest(batch: Batch, ctx: Context, run: PytestRun, share: float | None, result: StepResult) -> None:
    # the session's deadline: it counts from the session's start across its rounds and starts
    deadline = None if share is None else share - run.grace_s
    if deadline is not None and deadline / run.rounds < MIN_ROUND_S:
        result.status = "skipped"
        result.detail = (f"{share:.0f} s of the deadline left for it: a round needs {MIN_ROUND_S:.0f} s plus "
                         f"{run.grace_s:.0f} s of grace")
        return
    log, report = batch.out / f"{run.name}.log", batch.out / f"{run.name}.json"
    until = None if share is None else time.monotonic() + share
    outcome = batch.run(pytest_argv(run, ctx, report, deadline), log, until=until, grace_s=run.grace_s)
    lines = log_tail(log, 1)
    result.status = outcome.status
    result.detail = f"{outcome.describe()}: {lines}" if lines else outcome.describe()
    ledger = _ledger(report)  # read once: what the run measured, skipped and was not let begin
    nothing = measured_nothing(ledger)
    if nothing and result.status == "ok":  # a selection that skipped whole measured nothing: not ok
        result.status, result.detail = "failed", f"{nothing}; {result.detail}"
    left_out = deadline_gaps(ledger)
    if left_out:  # not the whole selection: cut (a failed test stays "failed", the more urgent word)
        result.status = "failed" if result.status == "failed" else "cut"
        result.detail = f"{left_out}; {result.detail}"
    fewer = rounds_not_begun(ledger)
    if fewer:  # every test measured, on fewer rounds or starts than asked: said, not cut
        result.detail = f"{fewer}; {result.detail}"
    result.outputs += [batch.output(p) for p in (log, report) if p.exists()]


def _ledger(report: Path) -> Ledger | None:
    """The ledger of a pytest run's JSON report; None when there is no readable report."""
    try:
        return ledger_of(json.loads(report.read_text()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def rounds_not_begun(ledger: Ledger | None) -> str:
    """The rounds or server starts ``--moeperf-deadline`` did not let begin (the run's warnings); "" when none or
    no readable report."""
    if ledger is None:
        return ""
    return "; ".join(w for w in ledger.warnings if " not begun: " in w)


def measured_nothing(ledger: Ledger | None) -> str:
    """Why a pytest run measured nothing: every selected test skipped (not by the deadline: that is
    `deadline_gaps`); "" when it measured something or there is no readable report."""
    if ledger is None:
        return ""
    reasons = [r for r in ledger.measured_nothing() if not r.startswith(DEADLINE_SKIP)]
    if not reasons:
        return ""
    return f"measured nothing: all {len(ledger.tests)} selected test(s) skipped ({'; '.join(reasons[:2])})"


def deadline_gaps(ledger: Ledger | None) -> str:
    """What ``--moeperf-deadline`` left out of a pytest run: the tests it skipped (how many, the first few) and the
    metrics MISSING; "" when it skipped none or there is no readable report."""
    if ledger is None:
        return ""
    skipped = ledger.deadline_skipped()
    if not skipped:
        return ""
    named = ", ".join(skipped[:NAMED]) + (", ..." if len(skipped) > NAMED else "")
    return (f"--moeperf-deadline skipped {len(skipped)} test(s): {named}; "
            f"{len(ledger.missing)} metric(s) MISSING")


def _served_model(url: str) -> tuple[str, str]:
    """(served model name, its path on the server) from ``GET /v1/models``."""
    with urllib.request.urlopen(url + "/v1/models", timeout=30.0) as resp:  # noqa: S310 (the server we started)
        model = json.loads(resp.read())["data"][0]
    return str(model["id"]), str(model.get("root") or model["id"])


def _attribution(batch: Batch, ctx: Context, unit: Attribution, share: float | None, result: StepResult) -> None:
    if share is not None and share < 2 * unit.grace_s:
        result.status, result.detail = "skipped", f"{share:.0f} s of the deadline left for it"
        return
    folder = batch.out / unit.name
    traces, url_file = folder / "traces", folder / "url"
    until = None if share is None else time.monotonic() + share
    argv = _moeperf(ctx, "serve", unit.profile, "--profiler-dir", str(traces), "--url-file", str(url_file),
                    "--log-dir", str(folder / "logs"), "--model-cache", str(ctx.model_cache))
    for profiles in ctx.profiles:
        argv += ["--profiles", str(profiles)]
    if unit.emulation:
        argv += ["--interconnect-emulation", unit.emulation]
    serve_log = folder / "serve.log"
    server = batch.start(argv, serve_log)
    ready = batch.wait(server, until=None if until is None else until - unit.grace_s, grace_s=unit.grace_s,
                       done=lambda: url_file.is_file() and bool(url_file.read_text().strip()))
    try:
        if ready.rc is not None or ready.cut:
            result.status = "cut" if ready.cut else "failed"
            result.detail = f"no healthy server: {ready.describe()}: " + " ".join(log_tail(serve_log, 3).split())
            return
        url = url_file.read_text().strip()
        batch.note(f"{unit.name}: {unit.profile} healthy at {url}")
        if unit.crosscheck:
            model, path = _served_model(url)
            for concurrency, prompts in CROSSCHECK:
                out = folder / f"crosscheck-c{concurrency}.txt"
                done = batch.run([ctx.python, "-m", "pytest_moeperf.serving.crosscheck", "--base-url", url, "--model",
                                  model, "--tokenizer", path, "--concurrency", str(concurrency), "--num-prompts",
                                  str(prompts)], out, until=until, grace_s=10.0)
                batch.note(f"{unit.name}: cross-check c={concurrency}: {done.describe()}")
        table = folder / "attribution.md"
        outcome = batch.run(_moeperf(ctx, "attribute", "--url", url, "--trace-dir", str(traces), "--batch",
                                     *map(str, unit.batches), "--max-tokens", "1024", "--markdown", "--json",
                                     str(folder / "attribution.json")), table, until=until, grace_s=10.0)
        result.status, result.detail = outcome.status, outcome.describe()
    finally:
        if server.poll() is None:  # moeperf serve stops its server on SIGINT
            batch.interrupt(server, unit.grace_s, "stopped")
        result.outputs.append(batch.output(folder))


def _budget(batch: Batch, ctx: Context, unit: Budget, result: StepResult) -> None:
    out = batch.out / "budget.txt"
    report = None if unit.report is None else batch.out / f"{unit.report}.json"
    sources: list[list[str]] = []
    if report is not None and report.is_file():
        sources.append(["--from-report", str(report)])
    if (ctx.baselines / ctx.facts.fingerprint).is_dir():
        sources.append(["--baselines", str(ctx.baselines), "--fingerprint", ctx.facts.fingerprint])
    else:
        batch.note(f"budget: no {ctx.baselines / ctx.facts.fingerprint}: no table from this machine's baselines")
    if ctx.budget_target and report is not None and report.is_file():
        sources.append(["--from-report", str(report), *ctx.budget_target])
    if not sources:
        result.status, result.detail = "skipped", "no kernel report and no baselines of this machine"
        return
    failed = [" ".join(src) for src in sources if not batch.run(
        _moeperf(ctx, "budget", *ctx.budget_args, *src), out, until=None, grace_s=10.0).ok]
    result.status = "failed" if failed else "ok"
    result.detail = f"{len(sources) - len(failed)} of {len(sources)} tables" + (
        f"; failed: {', '.join(failed)}" if failed else "")
    result.outputs.append(batch.output(out))


def run_unit(batch: Batch, ctx: Context, unit: Unit, units_left: Sequence[Unit]) -> StepResult:
    """Run ``unit`` (``units_left`` starts with it), sweep what it left running, record and return its result."""
    result = StepResult(unit.name, "ok")
    began = time.monotonic()
    share = _share(batch, units_left)
    if isinstance(unit, Topology):
        _topology(batch, ctx, result)
    elif isinstance(unit, PytestRun):
        _pytest(batch, ctx, unit, share, result)
    elif isinstance(unit, Attribution):
        _attribution(batch, ctx, unit, share, result)
    else:
        _budget(batch, ctx, unit, result)
    result.seconds = time.monotonic() - began
    batch.sweep(result)
    batch.record(result)
    return result
