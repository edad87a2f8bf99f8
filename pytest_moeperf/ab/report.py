"""What ``moeperf ab`` shows and writes, through the reporters of a normal run: the verdict table and reasons
(`reports.render`), the Markdown summary (`reports.markdown`), the JSON document (`reports.document`: the
pytest-benchmark schema, the run's ledger under ``moeperf`` and the A/B facts under ``moeperf.ab``: both sides'
provenance, every metric's pairs and statistics), the HTML report (`history.plugin.write_html`) and JUnit XML.
The A/B specifics are report sections (`ledger.Section`): the paired statistics and the two sides."""

from __future__ import annotations

import json
import math
import xml.etree.ElementTree as ElementTree
from collections.abc import Mapping, Sequence
from typing import Any

from pytest_moeperf.ab.sides import Side, env_difference, version_difference
from pytest_moeperf.ab.verdicts import Outcome, interval_text, relative
from pytest_moeperf.judging.verdict import Status, Verdict
from pytest_moeperf.ledger import Ledger, Section
from pytest_moeperf.reports import document, junit, markdown, render


def _pct(value: float | None, signed: bool = True) -> str:
    if value is None:
        return "-"
    return f"{value * 100:+.2f} %" if signed else f"{value * 100:.2f} %"


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def where(side: Side) -> str:
    """A side's checkout in a few words: ``REF @ commit``, or this checkout at its commit (dirty or not)."""
    if side.ref is not None and side.commit is not None:
        return f"{side.ref} @ {side.commit[:10]}"
    git = side.facts.get("git") or {}
    commit = git.get("id")
    dirty = " (uncommitted changes)" if git.get("dirty") else ""
    return f"this checkout @ {commit[:10]}{dirty}" if commit else "this checkout (not a git commit)"


def header(base: Side, head: Side, aa: bool, pairs: int, blocks: int, seed: int) -> str:
    if aa:
        return (f"A/A calibration: base ({where(base)}) against itself, {pairs} pairs in {blocks} block(s), "
                f"seed {seed}; baseline = first run, current = second run")
    return (f"A/B: base ({where(base)}) vs head ({where(head)}), {pairs} pairs in {blocks} block(s), seed {seed}; "
            "baseline = base, current = head, Δ = paired Hodges-Lehmann change")


def pairs_section(outcomes: Mapping[str, Outcome], alpha: float) -> Section:
    """Each metric's paired statistics: the change and its interval, p and q, the noise of one pair, the mde."""
    rows = []
    for key, outcome in outcomes.items():
        e = outcome.evidence
        if e is None:
            continue
        v = outcome.verdict
        rows.append((key, e.n, _pct(v.change), interval_text(e, alpha).split(" CI ", 1)[1], f"{e.p:.3g}",
                     f"{outcome.q:.3g}" if outcome.q is not None else "-", _pct(relative(e.sigma), signed=False),
                     _pct(v.mde, signed=False), _pct(v.threshold.tolerance, signed=False), v.status.value))
    return Section(f"A/B pairs: log ratio head/base per pair, {(1 - alpha) * 100:g} % intervals (alpha {alpha:.3g} "
                   "a look)",
                   ("metric", "pairs", "Δ", "CI", "p", "q (BH)", "noise/pair", "mde", "min effect", "verdict"),
                   tuple(rows), note="p: exact Wilcoxon signed-rank test; q: Benjamini-Hochberg over the metrics of "
                                     "this run; mde: the change detectable with 80 % power at these pairs and "
                                     "this alpha")


def sides_section(base: Side, head: Side, aa: bool) -> Section:
    """Both sides' provenance: checkout, interpreter and its version, the pytest_moeperf it imports, the environment
    set; the differences."""

    def python(side: Side) -> str:
        version = side.facts.get("python_version")
        return f"{side.python} ({version})" if version else side.python

    def env(side: Side) -> str:
        return " ".join(f"{k}={v}" for k, v in sorted(side.env.items())) or "-"

    rows = [("checkout", where(base), where(head)), ("python", python(base), python(head)),
            ("pytest_moeperf", base.plugin or "-", head.plugin or "-"), ("environment set", env(base), env(head))]
    differences = difference_lines(base, head)
    note = "the same side twice (A/A)" if aa else ("differences: " + "; ".join(differences) if differences
                                                    else "no difference in environment or versions")
    return Section("A/B sides", ("", "base", "head"), tuple(rows), note=note)


def difference_lines(base: Side, head: Side) -> list[str]:
    checkout = [f"checkout: {where(base)} -> {where(head)}"] if where(base) != where(head) else []
    python = [f"python: {base.python} -> {head.python}"] if base.python != head.python else []
    versions = version_difference(base.facts.get("software") or {}, head.facts.get("software") or {})
    return checkout + python + [f"env {d}" for d in env_difference(base.env, head.env)] + versions


def ab_facts(outcomes: Mapping[str, Outcome], base: Side, head: Side, run: Mapping[str, Any]) -> dict[str, Any]:
    """The A/B section of the JSON document: the run's facts, both sides, each metric's pairs and statistics."""
    metrics = {}
    for key, outcome in outcomes.items():
        e = outcome.evidence
        if e is not None:
            metrics[key] = {"pairs": e.n, "log_ratios": list(e.differences), "p": e.p, "q": outcome.q,
                            "estimate": relative(e.estimate), "low": _finite(relative(e.low)),
                            "high": _finite(relative(e.high)), "noise": relative(e.sigma),
                            "mde": outcome.verdict.mde}
    return {**run, "sides": {"base": base.provenance(), "head": head.provenance()},
            "differences": difference_lines(base, head), "metrics": metrics}


def report_document(ledger: Ledger, head_document: Mapping[str, Any] | None, facts: Mapping[str, Any]
                    ) -> dict[str, Any]:
    """The run's JSON document; machine and commit facts from the head side's first report (this box, head's
    commit), the fingerprint beside the ledger as a normal run writes it."""
    source = head_document or {}
    machine = dict(source.get("machine_info") or document.base_machine_info())
    commit = dict(source.get("commit_info") or {})
    session = source.get("moeperf") or {}
    extra = {k: session[k] for k in ("fingerprint", "hash", "host") if k in session}
    # stats.data: head's process medians, the values each verdict's summary is of (not both sides' samples pooled)
    data = {key: list(r.verdict.round_medians) for key, r in ledger.records.items() if r.verdict is not None}
    return document.document(ledger, machine, commit, {**extra, "ab": dict(facts)}, data)


def dumps(doc: Mapping[str, Any]) -> str:
    return json.dumps(doc, indent=2, sort_keys=True, allow_nan=False) + "\n"


def junit_xml(verdicts: Sequence[Verdict]) -> str:
    """One test case per metric: REGRESSED fails it, INCONCLUSIVE and MISSING skip it; the verdict's facts are
    its properties (`reports.junit`)."""
    suite = ElementTree.Element("testsuite", name="moeperf-ab", tests=str(len(verdicts)),
                                failures=str(sum(v.status is Status.REGRESSED for v in verdicts)),
                                skipped=str(sum(v.status in (Status.INCONCLUSIVE, Status.MISSING)
                                                for v in verdicts)), errors="0")
    for v in verdicts:
        test_id, _, metric = v.key.rpartition("::")
        path, _, function = test_id.partition("::")
        case = ElementTree.SubElement(suite, "testcase", classname=path.removesuffix(".py").replace("/", "."),
                                      name=f"{function}::{metric}", time="0")
        properties = ElementTree.SubElement(case, "properties")
        for name, value in junit.properties([v]):
            ElementTree.SubElement(properties, "property", name=name, value=value)
        if v.status is Status.REGRESSED:
            ElementTree.SubElement(case, "failure", message=v.message())
        elif v.status in (Status.INCONCLUSIVE, Status.MISSING):
            ElementTree.SubElement(case, "skipped", message=v.reason)
    root = ElementTree.Element("testsuites")
    root.append(suite)
    return ElementTree.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


def terminal_lines(ledger: Ledger, head_line: str, notes: Sequence[str]) -> list[str]:
    lines = render.terminal_lines(ledger.verdicts, ledger.sections, head_line)
    return lines + [f"moeperf: {w}" for w in ledger.warnings] + list(notes)


def markdown_text(ledger: Ledger, head_line: str, notes: Sequence[str]) -> str:
    lines = markdown.markdown_lines(ledger.verdicts, ledger.sections, head_line, ledger.warnings)
    if notes:
        lines += [f"- {markdown.md_text(note)}" for note in notes] + [""]
    return "\n".join(lines) + "\n"
