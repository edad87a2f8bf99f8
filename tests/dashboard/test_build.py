"""``moeperf dashboard`` on SQLite and a real PostgreSQL: what the site holds, and bad input (an empty history, an
unreachable server, an ``--out`` that is not a dashboard) refused with a clear message and nothing written."""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from pytest_moeperf import cli
from pytest_moeperf.dashboard import render
from pytest_moeperf.dashboard.build import DashboardError, Options, guarded, write_site
from pytest_moeperf.dashboard.model import page_of
from pytest_moeperf.history.store import HistoryStore
from tests.dashboard.histories import ALLREDUCE, GEMM, fill
from tests.history.conftest import listing


def payload(page: Path) -> dict[str, Any]:
    found = re.search(r"window\.MOEPERF_PAGE = (.*?);</script>", page.read_text())
    assert found, page
    data: dict[str, Any] = json.loads(found.group(1))
    return data


def sessions_of(site: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((site / "data" / "sessions.js").read_text().split("= ", 1)[1].rstrip(";\n"))
    return data


def test_a_site_from_either_backend_marks_the_step_at_its_commit(target: str, tmp_path: Path) -> None:
    made = fill(target)
    out = tmp_path / "site"
    built = guarded(Options(target=target, out=out, jobs=1), lambda _: None)
    assert (built.shown, built.total, built.metrics, built.families) == (24, 24, 7, 2)
    assert json.loads((out / render.MANIFEST).read_text())["format"] == render.FORMAT
    for name in render.STATIC:
        assert (out / "static" / name).is_file()
    index = payload(out / "index.html")
    assert [(r["suite"], r["metric"], len(r["cases"])) for r in index["rows"]] == [("allreduce", "latency", 3),
                                                                                   ("gemm", "time", 4)]
    sessions = sessions_of(out)
    hosts = [lane["host"] for lane in sessions["lanes"]]
    gemm = index["rows"][1]
    for lane in gemm["lanes"]:
        top = lane["steps"][0]  # the group with the most cases first
        assert top["n"] == 4 and top["rel"] == pytest.approx(0.10, abs=0.02)
        assert sessions["sessions"][str(top["s"])][1] == made.step_commit[hosts[lane["lane"]]]
    page = payload(out / page_of(GEMM.format(0)))
    for lane in page["lanes"]:
        [step] = lane["steps"]
        assert sessions["sessions"][str(step["s"])][1] == made.step_commit[hosts[lane["lane"]]]
        assert step["versions"] == ["vllm 0.32.0 -> 0.33.0"]
        regressed = [p for p in lane["p"] if p[3] == "REGRESSED"]
        assert regressed and all("beyond the 5 % mde" in p[7] for p in regressed)
    # 0.5 % noise alone: whatever Otava finds there is small; --min-magnitude 5 % keeps the 10 % step only
    guarded(Options(target=target, out=out, jobs=1, min_magnitude=0.05), lambda _: None)
    assert all(not lane["steps"] for lane in payload(out / page_of(ALLREDUCE.format(0)))["lanes"])
    assert all(len(lane["steps"]) == 1 for lane in payload(out / page_of(GEMM.format(0)))["lanes"])


def test_the_window_keeps_the_last_sessions_of_each_host(tmp_path: Path) -> None:
    target = str(tmp_path / "h.sqlite")
    fill(target)
    built = guarded(Options(target=target, out=tmp_path / "site", sessions=5, jobs=1), lambda _: None)
    assert (built.shown, built.total) == (10, 24)
    assert sorted(int(s) for s in sessions_of(tmp_path / "site")["sessions"]) == list(range(15, 25))


def _refused(args: list[str], capsys: pytest.CaptureFixture[str], *expected: str) -> None:
    assert cli.main(["dashboard", *args]) == 2
    err = capsys.readouterr().err
    for text in expected:
        assert text in err, err


def test_an_empty_history_is_refused_and_nothing_is_written(target: str, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    HistoryStore.open(target).close()  # the schema, no session
    out = tmp_path / "site"
    with pytest.raises(DashboardError, match="holds no session yet"):
        guarded(Options(target=target, out=out, jobs=1), lambda _: None)
    _refused(["--db", target, "--out", str(out)], capsys, "holds no session yet", f"nothing written to {out}")
    assert not out.exists() and listing(tmp_path) == ([] if target.startswith("postgresql") else ["history.sqlite"])


def test_an_unreachable_postgresql_is_refused_without_its_password(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("psycopg")
    url = f"postgresql://moeperf:secret@/db?host={tmp_path}&port=1&connect_timeout=2"
    _refused(["--db", url, "--out", str(tmp_path / "site")], capsys, "cannot open history postgresql://moeperf:***@",
             "nothing written")
    assert list(tmp_path.iterdir()) == []
    assert "secret" not in capsys.readouterr().err


def test_a_missing_sqlite_history_is_refused_not_created(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _refused(["--db", str(tmp_path / "none.sqlite"), "--out", str(tmp_path / "site")], capsys, "no history at")
    assert list(tmp_path.iterdir()) == []


def test_an_out_that_is_not_a_dashboard_is_refused_before_reading(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    target = str(tmp_path / "h.sqlite")
    fill(target, sessions=4)
    mine = tmp_path / "docs"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    _refused(["--db", target, "--out", str(mine)], capsys, f"--out {mine} exists and is not a moeperf dashboard")
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]
    _refused(["--db", target, "--out", str(mine / "notes.txt")], capsys, "is a file, not a folder")
    assert listing(tmp_path) == ["docs", "h.sqlite"], "no build folder left beside it"


def test_an_earlier_dashboard_or_an_empty_folder_is_replaced_whole(tmp_path: Path) -> None:
    target = str(tmp_path / "h.sqlite")
    fill(target, sessions=6)
    out = tmp_path / "site"
    out.mkdir()
    guarded(Options(target=target, out=out, jobs=1), lambda _: None)
    (out / "m" / "stale.html").write_text("from an older build")
    guarded(Options(target=target, out=out, jobs=1), lambda _: None)
    assert not (out / "m" / "stale.html").exists() and (out / "index.html").is_file()
    assert listing(tmp_path) == ["h.sqlite", "site"]


def test_a_write_that_fails_half_way_leaves_the_earlier_site(tmp_path: Path) -> None:
    out = tmp_path / "site"
    write_site(out, {"index.html": "old", render.MANIFEST: "{}"})
    with pytest.raises(OSError):  # "a" is a file, so "a/b" cannot be written: after "a", before the rename
        write_site(out, {"index.html": "new", "a": "x", "a/b": "y"})
    assert (out / "index.html").read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["site"]


def test_a_history_of_an_older_schema_reads_without_reasons(tmp_path: Path) -> None:
    """A history written before schema 3 (no reason column) is refused by a read, which never migrates (issue 37);
    once `moeperf history upgrade` migrated it, its verdicts have no reason."""
    path = tmp_path / "h.sqlite"
    fill(str(path), sessions=4)
    with sqlite3.connect(path) as conn:
        conn.execute("ALTER TABLE moeperf_metrics DROP COLUMN reason")
        conn.execute("DELETE FROM moeperf_schema WHERE version = 3")
    with pytest.raises(DashboardError, match=f"schema 2, older than .*moeperf history --db {path} upgrade"):
        guarded(Options(target=str(path), out=tmp_path / "site", jobs=1), lambda _: None)
    assert cli.main(["history", "--db", str(path), "upgrade"]) == 0
    guarded(Options(target=str(path), out=tmp_path / "site", jobs=1), lambda _: None)
    page = payload(tmp_path / "site" / page_of(GEMM.format(0)))
    assert all(p[7] is None for lane in page["lanes"] for p in lane["p"])


def test_ab_reports_are_shown_beside_the_sessions_of_their_head_commit(tmp_path: Path) -> None:
    target = str(tmp_path / "h.sqlite")
    fill(target, sessions=4)
    key = GEMM.format(1)
    doc = {"commit_info": {"id": "0002" + "c0ffee" * 6},
           "benchmarks": [{"fullname": key, "extra_info": {"verdict": "REGRESSED", "change": 0.031,
                                                         "reason": "paired +3.1 % beyond the 2 % minimum effect"}}],
           "moeperf": {"hash": "0123456789ab", "ab": {
               "sides": {"base": {"ref": "main", "commit": "0001" + "c0ffee" * 6}, "head": {"ref": None}},
               "metrics": {key: {"pairs": 9, "p": 0.004, "low": 0.02, "high": 0.04, "estimate": 0.031}}}}}
    (tmp_path / "ab").mkdir()
    (tmp_path / "ab" / "head.json").write_text(json.dumps(doc))
    (tmp_path / "ab" / "other.json").write_text("{}")  # in a folder, files that are not A/B reports are passed over
    guarded(Options(target=target, out=tmp_path / "site", jobs=1, ab=(tmp_path / "ab",)), lambda _: None)
    [row] = payload(tmp_path / "site" / page_of(key))["ab"]
    assert row == {"s": 3, "report": "head.json", "base": "main @ 0001c0ffee", "status": "REGRESSED",
                   "change": 0.031, "low": 0.02, "high": 0.04, "p": 0.004, "pairs": 9,
                   "reason": "paired +3.1 % beyond the 2 % minimum effect"}
    with pytest.raises(DashboardError, match="not a moeperf ab report"):
        guarded(Options(target=target, out=tmp_path / "site", jobs=1, ab=(tmp_path / "ab" / "other.json",)),
                lambda _: None)
