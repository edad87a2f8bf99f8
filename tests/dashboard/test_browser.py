"""A built dashboard in a real browser: headless Chromium (Debian's ``chromium``) loads the pages from disk and the
test reads the DOM and the chart's pixels through the DevTools protocol: the index lists the suites and flags the
step, a metric page draws each host's series and its change points, and the filters change what is shown.

The site is built from a small history written through the real store (`histories.fill`): this tests rendering,
not measurement. Without Chromium the tests skip, saying how to install it; CI installs it (``.ci/run``)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pytest_moeperf.dashboard.build import Options, guarded
from pytest_moeperf.dashboard.model import page_of
from tests.dashboard import chromium
from tests.dashboard.histories import GEMM, Made, fill
from tests.dashboard.test_build import payload

EXECUTABLE = chromium.binary()
REQUIRE = "MOEPERF_REQUIRE_CHROMIUM"  # .ci/run sets it: there a missing Chromium fails the test, not skips it
if EXECUTABLE is None and os.environ.get(REQUIRE) != "1":
    pytestmark = pytest.mark.skip(reason="Chromium is not installed (Debian: apt-get install chromium); .ci/run "
                                  "installs it for this test")
HOST_COLORS = {"runner-a": (0x1F, 0x77, 0xB4), "runner-b": (0x2C, 0xA0, 0x2C)}  # dashboard.js COLORS[lane]
LANE_COLORS = ("#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#17becf", "#bcbd22", "#7f7f7f", "#e377c2")  # all of them
STEP_COLOR = (0xD8, 0x1B, 0x60)

# Pixels of the chart's canvas near an RGB colour: their count, and the columns where at least `tall` of them stand
# one above the other (a vertical line).
PIXELS = """(function (rgb, tall) {
  var canvas = document.querySelector("#chart canvas"), ctx = canvas.getContext("2d");
  var img = ctx.getImageData(0, 0, canvas.width, canvas.height).data, columns = {}, count = 0;
  for (var i = 0; i < img.length; i += 4) {
    if (Math.abs(img[i] - rgb[0]) < 12 && Math.abs(img[i + 1] - rgb[1]) < 12 && Math.abs(img[i + 2] - rgb[2]) < 12
        && img[i + 3] > 200) { count++; var x = (i / 4) % canvas.width; columns[x] = (columns[x] || 0) + 1; }
  }
  return {count: count, lines: Object.keys(columns).filter(function (x) { return columns[x] >= tall; }).map(Number)};
})"""


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Made]:
    root = tmp_path_factory.mktemp("dashboard")
    made = fill(str(root / "history.sqlite"))
    guarded(Options(target=str(root / "history.sqlite"), out=root / "site", jobs=1, min_magnitude=0.05),
            lambda _: None)
    return root / "site", made


@pytest.fixture(scope="module")
def page() -> Iterator[chromium.Page]:
    assert EXECUTABLE is not None, f"{REQUIRE}=1 but no chromium on PATH"
    with chromium.browser(EXECUTABLE) as browser:
        tab = browser.page()
        tab.call("Network.enable")
        yield tab


def load(page: chromium.Page, path: Path, fragment: str = "") -> None:
    page.goto(chromium.url(path, fragment))
    assert page.evaluate("document.body.dataset.rendered") == "1"
    assert page.evaluate("document.getElementById('error').hidden"), page.evaluate("document.body.innerText")
    requests = [e["params"]["request"]["url"] for e in page.browser.events
                if e.get("method") == "Network.requestWillBeSent"]
    assert requests and all(u.startswith("file://") for u in requests), requests  # nothing from the network
    page.browser.events.clear()


def choose(page: chromium.Page, name: str, value: str) -> None:
    """Pick a filter as a person does: set the select and fire its change event."""
    page.evaluate(f"(function () {{ var s = document.getElementById('f-{name}'); s.value = {value!r}; "
                  "s.dispatchEvent(new Event('change')); })()")


def texts(page: chromium.Page, selector: str) -> list[Any]:
    found: list[Any] = page.evaluate(f"Array.from(document.querySelectorAll({selector!r}))"
                                     ".map(function (e) { return e.textContent; })")
    return found


def test_the_index_lists_the_suites_and_flags_the_step(site: tuple[Path, Made], page: chromium.Page) -> None:
    out, made = site
    load(page, out / "index.html")
    assert texts(page, "#index td.suite") == ["allreduce", "gemm"]
    assert page.evaluate("document.querySelectorAll('#index tr.stepped').length") == 1
    flags = texts(page, "#index tr.stepped .stepflag")
    assert len(flags) == 2 and all("▲ +" in f and " worse at " in f and "(4/4 cases" in f for f in flags), flags
    for commit in made.step_commit.values():
        assert any(f" at {commit[:7]} " in f for f in flags), (commit, flags)
    assert page.evaluate("document.querySelectorAll('#index svg.spark').length") == 4  # 2 families x 2 hosts


def test_a_metric_page_draws_each_host_and_the_change_points(site: tuple[Path, Made], page: chromium.Page) -> None:
    out, made = site
    load(page, out / page_of(GEMM.format(0)))
    for host, rgb in HOST_COLORS.items():
        assert page.evaluate(f"{PIXELS}({list(rgb)}, 1000)")["count"] > 200, f"{host}'s series is not drawn"
    height = page.evaluate("document.querySelector('#chart canvas').height")
    lines = page.evaluate(f"{PIXELS}({list(STEP_COLOR)}, {height // 4})")["lines"]
    # a 2-px line anti-aliased over neighbouring columns is one line: count runs of adjacent columns
    starts = [x for i, x in enumerate(lines) if i == 0 or x - lines[i - 1] > 2]
    assert len(starts) == 2, lines  # one change point per host, one session apart
    steps = page.evaluate("Array.from(document.querySelectorAll('#steps tbody tr'))"
                          ".map(function (r) { return r.dataset.commit; })")
    assert sorted(steps) == sorted(made.step_commit.values())
    assert "REGRESSED" in texts(page, "#points td.verdict") and "PASS" in texts(page, "#points td.verdict")
    assert any("beyond the 5 % mde" in r for r in texts(page, "#points td.reason"))


def test_the_filters_change_what_is_shown(site: tuple[Path, Made], page: chromium.Page) -> None:
    out, made = site
    load(page, out / "index.html")
    choose(page, "suite", "gemm")
    assert texts(page, "#index td.suite") == ["gemm"]
    choose(page, "host", "runner-b")
    assert page.evaluate("location.hash") == "#suite=gemm&host=runner-b"
    assert page.evaluate("Array.from(document.querySelectorAll('.lane')).map(function (l) "
                         "{ return l.dataset.lane; })") == ["runner-b"]
    choose(page, "branch", "topic")  # sessions 20-23: after the step, so no change point
    assert texts(page, "#index .steps .none") == ["no change point"]

    load(page, out / page_of(GEMM.format(0)), "host=runner-a")  # a filtered view is a link
    assert set(page.evaluate("Array.from(document.querySelectorAll('#points tbody tr'))"
                             ".map(function (r) { return r.dataset.lane; })")) == {"runner-a"}
    assert page.evaluate(f"{PIXELS}({list(HOST_COLORS['runner-b'])}, 1000)")["count"] == 0
    assert len(texts(page, "#steps tbody tr")) == 1
    choose(page, "host", "")
    choose(page, "days", "7")  # 24 sessions 8 hours apart: the last 7 days leave out the first 2 (16 hours)
    assert len(texts(page, "#points tbody tr")) == 22
    choose(page, "branch", "topic")
    assert len(texts(page, "#points tbody tr")) == 4
    assert page.evaluate("document.getElementById('nosteps') !== null")
    assert page.evaluate("document.querySelector('a.home').getAttribute('href')") == "../index.html#branch=topic&days=7"


@pytest.fixture(scope="module")
def real_site(real_suites: tuple[Path, int], tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("real-dashboard") / "site"
    guarded(Options(target=str(real_suites[0]), out=out, jobs=1), lambda _: None)
    return out


def test_the_real_suites_draw_with_their_zeros(real_site: Path, page: chromium.Page) -> None:
    """A history of the four real suites (`real_history`): a ``failed_rate`` of 0 is drawn on its line at 0 (the chart
    once spanned 0 .. 0 and drew nothing), and a level a session lacks (a start-up phase whose usual value is 0 s and
    that was not 0) is a gap in the sparkline, not a point at 0."""
    load(page, real_site / "index.html")
    suites = texts(page, "#index td.suite")
    assert sorted(set(suites)) == ["allreduce", "gemm", "machine", "serving", "specdecode"]
    assert suites[0] == "machine"  # the canary's rows come first: the machine before the families it moves
    rows = payload(real_site / "index.html")["rows"]
    assert page.evaluate("document.querySelectorAll('#index svg.spark').length") == sum(len(r["lanes"]) for r in rows)
    gapped = [(r, lane) for r in rows for lane in r["lanes"] if None in lane["y"][-30:] and len(lane["y"]) > 1]
    assert gapped, "the real history has a session without a level"
    titles = texts(page, "#index svg.spark title")
    assert sum("without one (cases whose usual value is 0 were not 0)" in t for t in titles) == len(gapped)
    points = page.evaluate("Array.from(document.querySelectorAll('#index svg.spark polyline'))"
                           ".map(function (p) { return p.getAttribute('points'); })")
    assert points and not any("NaN" in p for p in points)
    failed = next(r for r in rows if r["metric"] == "failed_rate" and len(r["lanes"]) > 1)
    load(page, real_site / failed["cases"][0]["page"])
    lanes = payload(real_site / failed["cases"][0]["page"])["lanes"]
    assert all(p[1] == 0.0 for lane in lanes for p in lane["p"])
    for lane in lanes:
        rgb = [int(LANE_COLORS[lane["lane"] % len(LANE_COLORS)][i:i + 2], 16) for i in (1, 3, 5)]
        assert page.evaluate(f"{PIXELS}({rgb}, 1000)")["count"] > 20, f"lane {lane['lane']}'s zeros are not drawn"
