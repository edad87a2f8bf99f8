"""``moeperf dashboard`` on SQLite and a real PostgreSQL: what the site holds, and bad input (an empty history, an
unreachable server, an ``--out`` that is not a dashboard) refused with a clear message and nothing written."""

from __future__ import annotations

import json
import os
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


def test_a_metric_whose_value_is_zero_is_drawn(pytester: pytest.Pytester, run_moeperf,  # type: ignore[no-untyped-def]
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """The issue's two sessions of a ``failed_rate`` of 0 (serving records one in every session): the build crashed
    with a ``KeyError`` in `model.index_rows`."""
    pytester.makepyfile(test_z='def test_z(perf):\n    perf.record("failed_rate", [0.0, 0.0], unit="fraction")\n')
    for _ in range(2):
        assert run_moeperf("--moeperf-history", "h.sqlite").ret == 0
    out = pytester.path / "site"
    assert cli.main(["dashboard", "--db", str(pytester.path / "h.sqlite"), "--out", str(out), "--jobs", "1"]) == 0
    assert "1 families, 1 metrics, 2 of 2 sessions" in capsys.readouterr().out
    [row] = payload(out / "index.html")["rows"]
    assert [(lane["y"], lane["k"]) for lane in row["lanes"]] == [([1.0, 1.0], [[0, 0, 0, 0, 1, 0]] * 2)]  # NEW x2
    [lane] = payload(out / page_of("test_z.py::test_z::failed_rate"))["lanes"]
    assert [p[1] for p in lane["p"]] == [0.0, 0.0]


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


@pytest.mark.parametrize("template", ["javascript:alert(1)//{commit}", "JavaScript:alert(1)//{commit}",
                                      "java\tscript:alert(1)//{commit}", "\x01javascript:alert(1)//{commit}",
                                      "data:text/html,<script>alert(1)</script>{commit}", "//evil.example/{commit}",
                                      "/commit/{commit}", " https://example.org/{commit}", "https:///{commit}",
                                      "ftp://example.org/{commit}", "https://example.org/commit"])
def test_a_commit_url_that_is_not_http_is_a_usage_error(template: str, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["dashboard", "--db", str(tmp_path / "h.sqlite"), "--out", str(tmp_path / "site"),
                  "--commit-url", template])
    assert exited.value.code == 2
    assert "argument --commit-url: expected" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_an_http_commit_url_links_the_commits(tmp_path: Path) -> None:
    fill(str(tmp_path / "h.sqlite"), sessions=3)
    for template in ("https://github.com/ORG/REPO/commit/{commit}", "HTTP://git.local:8080/c?id={commit}"):
        assert cli.main(["dashboard", "--db", str(tmp_path / "h.sqlite"), "--out", str(tmp_path / "site"),
                         "--commit-url", template]) == 0
        assert sessions_of(tmp_path / "site")["commit_url"] == template


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
    (out / "m" / "stale.html").write_text("from an older build")  # as if an older build had written it:
    manifest = json.loads((out / render.MANIFEST).read_text())
    (out / render.MANIFEST).write_text(json.dumps({**manifest, "files": [*manifest["files"], "m/stale.html"]}))
    built = guarded(Options(target=target, out=out, jobs=1), lambda _: None)
    assert not (out / "m" / "stale.html").exists() and (out / "index.html").is_file()
    assert listing(tmp_path) == ["h.sqlite", "site"]
    assert built.kept == built.dropped == ()
    listed = json.loads((out / render.MANIFEST).read_text())["files"]
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()) == listed


def test_a_rebuild_keeps_the_files_no_build_wrote(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A ``CNAME``, a ``.nojekyll``, a folder and a link of one's own survive a rebuild, and the build says so (they
    were deleted silently); what cannot be kept is named."""
    target = str(tmp_path / "h.sqlite")
    fill(target, sessions=4)
    out = tmp_path / "site"
    guarded(Options(target=target, out=out, jobs=1), lambda _: None)
    added = {"CNAME": "perf.example.org\n", ".nojekyll": "", "notes/about.md": "ours", "m/pinned.html": "mine"}
    for name, text in added.items():
        (out / name).parent.mkdir(exist_ok=True)
        (out / name).write_text(text)
    (out / "latest").symlink_to("index.html")
    os.mkfifo(out / "pipe")
    manifest = json.loads((out / render.MANIFEST).read_text())  # as if the earlier build had not written index.html
    (out / render.MANIFEST).write_text(json.dumps({**manifest, "files": [f for f in manifest["files"]
                                                                         if f != "index.html"]}))
    assert cli.main(["dashboard", "--db", target, "--out", str(out), "--jobs", "1"]) == 0
    err = capsys.readouterr().err
    kept = ".nojekyll, CNAME, latest, m/pinned.html, notes/about.md"
    assert f"kept 5 file(s) of {out} that no build wrote: {kept}" in err
    assert f"not kept from {out}: index.html (the build writes its own), pipe (not a regular file or a symlink)" in err
    for name, text in added.items():
        assert (out / name).read_text() == text
    assert os.readlink(out / "latest") == "index.html" and not (out / "pipe").exists()
    assert "window.MOEPERF_PAGE" in (out / "index.html").read_text()
    # what was kept is still not the build's: kept again by the next build
    assert guarded(Options(target=target, out=out, jobs=1), lambda _: None).kept == (
        ".nojekyll", "CNAME", "latest", "m/pinned.html", "notes/about.md")


def test_a_dashboard_whose_manifest_lists_no_files_keeps_what_is_outside_its_folders(tmp_path: Path) -> None:
    """An earlier build's manifest without a list of files (format 1): ``index.html``, the manifest, ``m/``,
    ``data/`` and ``static/`` are the build's, anything else is kept."""
    target = str(tmp_path / "h.sqlite")
    fill(target, sessions=4)
    out = tmp_path / "site"
    write_site(out, {"index.html": "old", "m/gone.html": "old", render.MANIFEST: '{"format": 1}'})
    (out / "CNAME").write_text("perf.example.org\n")
    assert guarded(Options(target=target, out=out, jobs=1), lambda _: None).kept == ("CNAME",)
    assert (out / "CNAME").is_file() and not (out / "m" / "gone.html").exists()


def test_an_out_that_is_a_symlink_gets_the_site_where_it_points(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """The link is kept and the site written where it points, nothing left beside either (the link was replaced by a
    folder, the folder it named kept the old site, and a ``.NAME.old-PID`` link was left behind)."""
    target = str(tmp_path / "h.sqlite")
    fill(target, sessions=4)
    www = tmp_path / "www"
    guarded(Options(target=target, out=www / "site", jobs=1), lambda _: None)
    (www / "site" / "index.html").write_text("from an older build")
    link = tmp_path / "site"
    link.symlink_to(www / "site")
    guarded(Options(target=target, out=link, jobs=1), lambda _: None)
    assert link.is_symlink() and link.readlink() == www / "site"
    assert "window.MOEPERF_PAGE" in (www / "site" / "index.html").read_text()
    assert listing(tmp_path) == ["h.sqlite", "site", "www"]
    assert [p.name for p in www.iterdir()] == ["site"]
    fresh = tmp_path / "fresh"  # a link to a folder not made yet: made there
    fresh.symlink_to("www/new")
    guarded(Options(target=target, out=fresh, jobs=1), lambda _: None)
    assert fresh.is_symlink() and (www / "new" / "index.html").is_file()
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "mine.txt").write_text("keep me")
    (tmp_path / "mine").symlink_to("notes")
    _refused(["--db", target, "--out", str(tmp_path / "mine")], capsys,
             f"--out {tmp_path / 'mine'} (a symlink to {tmp_path / 'notes'}) exists and is not a moeperf dashboard")
    (tmp_path / "loop").symlink_to("loop")
    _refused(["--db", target, "--out", str(tmp_path / "loop")], capsys, "is a symlink that cannot be followed")
    assert listing(tmp_path) == ["fresh", "h.sqlite", "loop", "mine", "notes", "site", "www"]
    assert [p.name for p in (tmp_path / "notes").iterdir()] == ["mine.txt"]


def test_out_dot_fills_the_current_folder_where_it_is(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--out .`` in an empty folder, documented as allowed, failed "Device or resource busy" (the current folder
    was renamed); it is filled where it is, and so is a rebuild there, keeping a file of one's own (issue 37, item
    18). The folder is the same one after (a shell started in it is not left in a deleted folder)."""
    target = str(tmp_path / "h.sqlite")
    fill(target, sessions=4)
    site = tmp_path / "www" / "site"
    site.mkdir(parents=True)
    monkeypatch.chdir(site)
    inode = os.stat(".").st_ino
    for _ in range(2):
        assert cli.main(["dashboard", "--db", target, "--out", ".", "--jobs", "1"]) == 0
        assert (site / "index.html").is_file() and os.stat(".").st_ino == inode == site.stat().st_ino
        assert [p.name for p in site.parent.iterdir()] == ["site"], "nothing left beside it"
        assert not [p.name for p in site.iterdir() if p.name.startswith(".moeperf-dashboard")], "nor inside it"
        (site / "CNAME").write_text("perf.example.org\n")
    assert (site / "CNAME").read_text() == "perf.example.org\n"


def test_a_refill_in_place_that_fails_half_way_leaves_the_earlier_site(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    write_site(Path("."), {"index.html": "old", render.MANIFEST: "{}"})
    with pytest.raises(OSError):  # "a" is a file, so "a/b" cannot be written
        write_site(Path("."), {"index.html": "new", "a": "x", "a/b": "y"})
    assert (tmp_path / "index.html").read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["index.html", render.MANIFEST]


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
