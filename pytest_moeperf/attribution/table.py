"""Render an :class:`~pytest_moeperf.attribution.trace.Attribution` the way ``moeperf budget`` renders its
per-component summary: component, per-step µs, share %; as rows, terminal lines, Markdown and a report
:class:`~pytest_moeperf.ledger.Section`. Formatters return lines; they print nothing."""

from __future__ import annotations

from pytest_moeperf.attribution.classify import COMPONENTS
from pytest_moeperf.attribution.trace import Attribution
from pytest_moeperf.ledger import Section

__all__ = ["COLUMNS", "attribution_lines", "attribution_markdown", "attribution_rows", "attribution_section",
           "title"]

COLUMNS: tuple[str, ...] = ("component", "per step (us)", "share %")


def title(a: Attribution) -> str:
    return f"Decode-step attribution ({a.device} trace): batch={a.batch}, {a.steps} steps"


def attribution_rows(a: Attribution) -> list[tuple[str, str, str]]:
    """One row per component, then idle/untraced, then the traced step time (share 100 %)."""
    rows = [(c, f"{a.component_us.get(c, 0.0):.4g}", f"{a.share_pct(c):.1f}") for c in COMPONENTS]
    rows.append((a.idle_label, f"{a.idle_us:.4g}", f"{a.idle_share_pct:.1f}"))
    rows.append(("step (traced)", f"{a.step_us:.4g}", "100.0"))
    return rows


def _note(a: Attribution) -> str:
    return (f"parts sum to {a.accounted_us:.4g} us of a {a.step_us:.4g} us step ({100 * a.sum_error:.1f} % off); "
            f"source {a.source}")


def attribution_lines(a: Attribution) -> list[str]:
    """Plain aligned columns for the terminal."""
    rows = attribution_rows(a)
    width = max(len(r[0]) for r in rows + [COLUMNS])
    out = [title(a), f"{COLUMNS[0]:<{width}}  {COLUMNS[1]:>14}  {COLUMNS[2]:>8}"]
    out += [f"{c:<{width}}  {us:>14}  {pct:>8}" for c, us, pct in rows]
    return out + [_note(a)]


def attribution_markdown(a: Attribution) -> list[str]:
    lines = [f"## {title(a)}", "", "| " + " | ".join(COLUMNS) + " |", "|---|---:|---:|"]
    lines += [f"| {c} | {us} | {pct} |" for c, us, pct in attribution_rows(a)]
    return lines + ["", _note(a)]


def attribution_section(a: Attribution) -> Section:
    return Section(title(a), COLUMNS, tuple(attribution_rows(a)), _note(a))
