"""A metric's name and unit reach matplotlib as plain text: ``$...$`` in them is not mathtext. ``$\\undefinedcmd$`` in
a unit lost the whole HTML report (one warning, no file) and crashed ``moeperf trend --plot`` with a traceback."""

from __future__ import annotations

import io
import json
import struct
import warnings
from pathlib import Path
from typing import Any

import matplotlib
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from pytest_moeperf import cli
from pytest_moeperf.history import plots
from pytest_moeperf.history.plugin import write_html

NAME, UNIT = "t$\\undefinedcmd$_{x}", "$\\undefinedcmd$"
SUITE = f"""
import os

def test_mathtext(perf):
    scale = float(os.environ.get("MOEPERF_TEST_SCALE", "1.0"))
    perf.record({NAME!r}, [x * scale for x in (10.0, 10.1, 9.9, 10.05, 9.95)], unit={UNIT!r})
"""
KEY = f"test_text.py::test_mathtext::{NAME}"


@pytest.fixture
def flagged(pytester: pytest.Pytester, run_moeperf: Any, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Three stored runs, then a 20 % slower one: REGRESSED, drawn in the session chart and as a trend."""
    pytester.makepyfile(test_text=SUITE)
    for _ in range(3):
        assert run_moeperf("--moeperf-update", "--moeperf-history", "h.sqlite").ret == 0
    monkeypatch.setenv("MOEPERF_TEST_SCALE", "1.2")
    run_moeperf("--moeperf-history", "h.sqlite", "--moeperf-report", "r.json", "--moeperf-html", "r.html",
                "-W", "error::pytest_moeperf.history.plugin.HistoryWarning").assert_outcomes(failed=1)
    return pytester.path


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    return int(width), int(height)


def test_the_html_report_draws_a_metric_named_in_mathtext(flagged: Path) -> None:
    page = (flagged / "r.html").read_text()
    assert "t$\\undefinedcmd$_{x}" in page and page.count("data:image/png;base64,") == 2  # session chart + trend
    doc = json.loads((flagged / "r.json").read_text())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert write_html(flagged / "again.html", doc, str(flagged / "h.sqlite"))


def test_trend_plot_draws_a_metric_named_in_mathtext(flagged: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for suffix in ("png", "svg"):
        out = flagged / f"trend.{suffix}"
        assert cli.main(["trend", "--db", str(flagged / "h.sqlite"), KEY, "--plot", str(out)]) == 0
        assert f"wrote {out}" in capsys.readouterr().out and out.stat().st_size > 1000
    assert _png_size((flagged / "trend.png").read_bytes()) == (900, 360)


def test_labels_keep_their_dollars_and_tex_stays_off(monkeypatch: pytest.MonkeyPatch) -> None:
    figure = Figure()
    FigureCanvasAgg(figure)
    text = figure.text(0, 0, plots.plain("a \\$ b $\\undefinedcmd$ 5$"))
    figure.savefig(io.BytesIO(), format="png")  # raised ValueError: Unknown symbol: \undefinedcmd
    assert text._preprocess_math(text.get_text()) == ("a \\$ b $\\undefinedcmd$ 5$", False)  # shown verbatim
    monkeypatch.setitem(matplotlib.rcParams, "text.usetex", True)  # a user's matplotlibrc: LaTeX for every label
    image, _ = plots.session_plot([])
    assert _png_size(image)[0] == 1000
