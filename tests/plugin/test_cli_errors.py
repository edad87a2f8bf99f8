"""Bad input to every ``moeperf`` subcommand: exit status 2 and one line saying what is wrong, never a traceback
(nothing here probes GPUs, runs suites or starts a server)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_moeperf.cli import main

ROOT = Path(__file__).parents[2]
PROFILES = str(ROOT / "suites" / "serving" / "profiles")
TRACE = ROOT / "tests" / "attribution" / "data" / "h200x2-graph-and-eager_rank0.pt.trace.json.gz"
TOPOLOGY = ROOT / "pytest_moeperf" / "topologies" / "2x-h200-nvlink.json"


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    """``moeperf ARGS`` in-process: the exit status (argparse's ``SystemExit`` included) and stderr's last line."""
    try:
        rc = main(list(args))
    except SystemExit as exc:
        rc = int(exc.code or 0)
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return rc, (err.strip().splitlines() or [""])[-1]


def failed(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """Exit status 2; the error line."""
    rc, line = run(capsys, *args)
    assert rc == 2, line
    return line


@pytest.fixture
def files(tmp_path: Path) -> Path:
    (tmp_path / "folder").mkdir()
    (tmp_path / "binary.json").write_bytes(b"\xff\xfe\x00")
    (tmp_path / "plain.txt").write_text("not a folder")
    return tmp_path


# --------------------------------------------------------------------------------------------- topology
def _topology_with(tmp_path: Path, **changes: object) -> str:
    data = {**json.loads(TOPOLOGY.read_text()), **changes}
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(data))
    return str(path)


def test_topology_file_that_is_a_folder_or_not_text(capsys: pytest.CaptureFixture[str], files: Path) -> None:
    assert "is a directory" in failed(capsys, "topology", "--topology", str(files / "folder"))
    assert "not UTF-8 text" in failed(capsys, "topology", "--topology", str(files / "binary.json"))


@pytest.mark.parametrize(("changes", "message"), [
    ({"host": "box"}, "field 'host' must be dict"),
    ({"software": [1]}, "field 'software' must be dict"),
    ({"links": {"a": 0}}, "field 'links' must be list"),
    ({"links": ["x"]}, "links[0]: expected an object"),
])
def test_topology_fields_of_the_wrong_type(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                           changes: dict[str, object], message: str) -> None:
    assert message in failed(capsys, "topology", "--topology", _topology_with(tmp_path, **changes))


def test_topology_gpu_and_link_numbers_must_be_numbers(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    data = json.loads(TOPOLOGY.read_text())
    gpus = [{**data["gpus"][0], "memory_bytes": "lots"}, data["gpus"][1]]
    assert "gpus[0]: field 'memory_bytes' must be int" in failed(
        capsys, "topology", "--topology", _topology_with(tmp_path, gpus=gpus))
    links = [{**data["links"][0], "nvlinks": "x"}]
    assert "links[0]: field 'nvlinks' must be int" in failed(
        capsys, "topology", "--topology", _topology_with(tmp_path, links=links))


def test_topology_json_to_a_folder_or_below_a_file(capsys: pytest.CaptureFixture[str], files: Path) -> None:
    assert "is a directory; name a file in it" in failed(
        capsys, "topology", "--topology", "2x-h200-nvlink", "--json", str(files / "folder"))
    assert "plain.txt is a file, not a directory" in failed(
        capsys, "topology", "--topology", "2x-h200-nvlink", "--json", str(files / "plain.txt" / "t.json"))


# --------------------------------------------------------------------------------------------- baselines
def _baseline_tree(root: Path, text: str | bytes) -> Path:
    (root / "cpu-x").mkdir(parents=True)
    path = root / "cpu-x" / "test_s.json"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return root


def test_baselines_given_a_file_says_so(capsys: pytest.CaptureFixture[str], files: Path) -> None:
    plain = str(files / "plain.txt")
    message = f"baselines directory {plain} is a file, not a directory"
    assert failed(capsys, "baselines", "diff", "--baselines", plain, "--old", str(files)).endswith(message)
    assert failed(capsys, "baselines", "diff", "--baselines", str(files), "--old", plain).endswith(message)
    assert failed(capsys, "baselines", "merge", plain, "--into", str(files)).endswith(message)
    assert failed(capsys, "baselines", "merge", str(files), "--into", plain).endswith(message)


@pytest.mark.parametrize(("text", "message"), [
    (b"\xff\xfe", "is not UTF-8 text"),
    ('{"schema": 1, "metrics": {}, "fingerprint": "abc"}', "'fingerprint' must be an object"),
])
def test_unusable_baseline_files(capsys: pytest.CaptureFixture[str], tmp_path: Path, text: str | bytes,
                                 message: str) -> None:
    tree = str(_baseline_tree(tmp_path / "b", text))
    (tmp_path / "empty").mkdir()
    assert message in failed(capsys, "baselines", "diff", "--baselines", tree, "--old", str(tmp_path / "empty"))
    assert message in failed(capsys, "baselines", "merge", tree, "--into", str(tmp_path / "empty"))
    assert message in failed(capsys, "budget", "--baselines", tree, "--fingerprint", "cpu-x")


def test_baseline_at_a_git_revision_that_is_no_baseline(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    def git(*args: str) -> None:
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    _baseline_tree(tmp_path / "baselines", "[1, 2]")
    git("init", "-q")
    git("-c", "user.email=t@t", "-c", "user.name=t", "add", ".")
    git("-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "list")
    (tmp_path / "baselines" / "cpu-x" / "test_s.json").write_text('{"schema": 1, "metrics": {}}')
    monkeypatch.chdir(tmp_path)
    assert "cpu-x/test_s.json is not a moeperf baseline" in failed(capsys, "baselines", "diff")
    assert "Not a valid object name nope" in failed(capsys, "baselines", "diff", "--rev", "nope")


@pytest.mark.parametrize("keep", ["0", "-3", "x"])
def test_merge_keep_must_be_a_positive_integer(capsys: pytest.CaptureFixture[str], tmp_path: Path, keep: str) -> None:
    assert "argument --keep:" in failed(capsys, "baselines", "merge", str(tmp_path), "--keep", keep)


def test_merge_with_nothing_new_says_so(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["baselines", "merge", str(tmp_path), "--into", str(tmp_path)]) == 0
    assert capsys.readouterr().out == f"{tmp_path} is up to date: nothing to merge\n"


# --------------------------------------------------------------------------------------------- budget
@pytest.mark.parametrize(("args", "message"), [
    (["--tp", "0"], "argument --tp: must be at least 1, got 0"),
    (["--tp", "-2"], "argument --tp: must be at least 1, got -2"),
    (["--batch", "0"], "argument --batch: must be at least 1, got 0"),
    (["--allreduce-us", "-5"], "argument --allreduce-us: must be a finite number >= 0, got -5"),
    (["--allreduce-us", "nan"], "argument --allreduce-us: must be a finite number >= 0, got nan"),
    (["--fingerprint", "cpu-x"], "--fingerprint needs --baselines DIR"),
    (["--model", "no-such-model", "--from-report", "r.json"],
     "moeperf budget: unknown model 'no-such-model': not one of"),
])
def test_budget_usage_errors(capsys: pytest.CaptureFixture[str], args: list[str], message: str) -> None:
    assert message in failed(capsys, "budget", *args)


def test_budget_inputs_that_cannot_be_read(capsys: pytest.CaptureFixture[str], files: Path) -> None:
    assert failed(capsys, "budget", "--model", str(files / "folder"), "--from-report", "r.json").startswith(
        f"moeperf budget: model config {files / 'folder'}: ")
    assert "is a directory, not a file" in failed(capsys, "budget", "--from-report", str(files / "folder"))
    assert "does not exist" in failed(capsys, "budget", "--from-report", str(files / "absent.json"))
    report = files / "report.json"
    report.write_text('{"benchmarks": [1]}')
    assert f"report {report}: benchmarks[0] is malformed" in failed(capsys, "budget", "--from-report", str(report))
    assert f"baselines directory {files / 'absent'} does not exist" in failed(
        capsys, "budget", "--baselines", str(files / "absent"), "--fingerprint", "x")
    assert "no baselines for fingerprint 'nope' under" in failed(
        capsys, "budget", "--baselines", str(files), "--fingerprint", "nope")
    assert "(there: folder)" in failed(capsys, "budget", "--baselines", str(files), "--fingerprint", "nope")


# --------------------------------------------------------------------------------------------- attribute
@pytest.mark.parametrize("url", ["notaurl", "ftp://host", "", "http://host:port", "http://"])
def test_attribute_url_must_be_http(capsys: pytest.CaptureFixture[str], tmp_path: Path, url: str) -> None:
    assert "argument --url: expected an http:// or https:// URL" in failed(
        capsys, "attribute", "--url", url, "--trace-dir", str(tmp_path))


@pytest.mark.parametrize(("args", "message"), [
    (["--batch", "0"], "argument --batch: must be at least 1, got 0"),
    (["--decode-tokens", "0"], "argument --decode-tokens: must be at least 1, got 0"),
    (["--max-tokens", "-1"], "argument --max-tokens: must be at least 1, got -1"),
    (["--rank", "-1"], "argument --rank: must be at least 0, got -1"),
    (["--timeout", "0"], "argument --timeout: must be a finite number > 0, got 0"),
])
def test_attribute_numbers(capsys: pytest.CaptureFixture[str], tmp_path: Path, args: list[str], message: str) -> None:
    assert message in failed(capsys, "attribute", "--url", "http://127.0.0.1:1", "--trace-dir", str(tmp_path), *args)


def test_attribute_paths(capsys: pytest.CaptureFixture[str], files: Path) -> None:
    plain = str(files / "plain.txt")
    assert f"--trace-dir {plain} is a file" in failed(capsys, "attribute", "--url", "http://h:1", "--trace-dir", plain)
    assert "does not exist" in failed(capsys, "attribute", "--trace", str(files / "absent.json"))
    assert "is a directory, not a file" in failed(capsys, "attribute", "--trace", str(files / "folder"))
    assert "ends in .json or .json.gz" in failed(capsys, "attribute", "--trace", plain)
    assert "is a directory; name a file in it" in failed(
        capsys, "attribute", "--trace", str(TRACE), "--json", str(files / "folder"))


@pytest.mark.parametrize("content", [b"[]", b"{}", b"{", b"\xff"])
def test_attribute_trace_that_is_no_trace(capsys: pytest.CaptureFixture[str], tmp_path: Path, content: bytes) -> None:
    pytest.importorskip("hta")
    trace = tmp_path / "worker.pt.trace.json"
    trace.write_bytes(content)
    assert f"{trace}: not a readable torch profiler trace" in failed(capsys, "attribute", "--trace", str(trace))


def test_attribute_server_not_listening(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    pytest.importorskip("aiohttp")
    line = failed(capsys, "attribute", "--url", "http://127.0.0.1:1", "--trace-dir", str(tmp_path))
    assert line.startswith("moeperf attribute: http://127.0.0.1:1: ") and "vLLM server listening" in line


# --------------------------------------------------------------------------------------------- history, trend
@pytest.fixture
def history(tmp_path: Path) -> str:
    from tests.history.test_cli_trend import store_sessions

    target = str(tmp_path / "h.sqlite")
    store_sessions(target, [100.0, 101.0, 99.0, 100.5])
    return target


def test_history_targets_that_are_no_database(capsys: pytest.CaptureFixture[str], files: Path) -> None:
    assert f"{files / 'folder'} is a directory, not a history database" in failed(
        capsys, "history", "--db", str(files / "folder"))
    assert "not mysql://" in failed(capsys, "history", "--db", "mysql://u:pw@host/db")
    assert "cannot read history" in failed(capsys, "trend", "x", "--db", str(files / "plain.txt"))


@pytest.mark.parametrize(("args", "message"), [
    (["history", "list", "--limit", "0"], "argument --limit: must be at least 1, got 0"),
    (["history", "list", "--limit", "-1"], "argument --limit: must be at least 1, got -1"),
    (["trend", "latency", "--max-pvalue", "2"], "argument --max-pvalue: must be a probability in (0, 1], got 2"),
    (["trend", "latency", "--max-pvalue", "0"], "argument --max-pvalue: must be a probability in (0, 1], got 0"),
    (["trend", "latency", "--min-magnitude", "-1"], "argument --min-magnitude: must be a finite number >= 0"),
    (["trend", "latency", "--min-magnitude", "5"], "argument --min-magnitude: a fraction in [0, 1) such as 0.05 is "
                                                   "expected: 5 means 500 %; for 5 % give 0.05 (or 5%)"),
    (["trend", "latency", "--window", "1"], "argument --window: must be at least 2, got 1"),
    (["trend", "latency", "--plot", "out.txt"], "--plot wants a .png or .svg path, got out.txt"),
])
def test_history_and_trend_options(capsys: pytest.CaptureFixture[str], history: str, args: list[str],
                                   message: str) -> None:
    assert message in failed(capsys, *args, "--db", history)


def test_trend_plot_paths(capsys: pytest.CaptureFixture[str], history: str, files: Path) -> None:
    assert "is a directory; name a file in it" in failed(
        capsys, "trend", "latency", "--db", history, "--plot", str(files / "folder"))
    assert "plain.txt is a file, not a directory" in failed(
        capsys, "trend", "latency", "--db", history, "--plot", str(files / "plain.txt" / "p.png"))


def test_unknown_fingerprint_is_named(capsys: pytest.CaptureFixture[str], history: str) -> None:
    for command in (["history", "show"], ["trend"]):
        assert failed(capsys, *command, "latency", "--db", history, "--fingerprint", "nope").endswith(
            "no metric matches latency in the runs of fingerprint nope")


# --------------------------------------------------------------------------------------------- serve
@pytest.fixture
def no_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every case below must be refused before a server could start."""
    from pytest_moeperf.serving.lifecycle.pool import ServerPool

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("moeperf serve got as far as starting a server")

    monkeypatch.setattr(ServerPool, "launch", refuse)


@pytest.mark.parametrize(("option", "message"), [
    ("--log-dir", "--log-dir {} is a file, not a directory"),
    ("--profiler-dir", "--profiler-dir {} is a file, not a directory"),
    ("--model-cache", "--model-cache {} is a file, not a directory"),
    ("--profiles", "--profiles {} is a file, not a directory"),
    ("--url-file", "argument --url-file: cannot write {}/u: "),
])
@pytest.mark.usefixtures("no_launch")
def test_serve_paths(capsys: pytest.CaptureFixture[str], files: Path, option: str, message: str) -> None:
    plain = files / "plain.txt"
    value = str(plain / "u") if option == "--url-file" else str(plain)
    assert message.format(plain) in failed(capsys, "serve", "cpu-tiny-nospec", "--profiles", PROFILES, option, value)


@pytest.mark.parametrize("timeout", ["0", "-1", "inf"])
@pytest.mark.usefixtures("no_launch")
def test_serve_timeout_must_be_positive(capsys: pytest.CaptureFixture[str], timeout: str) -> None:
    assert "argument --timeout: must be a finite number > 0" in failed(
        capsys, "serve", "cpu-tiny-nospec", "--profiles", PROFILES, "--timeout", timeout)


@pytest.mark.usefixtures("no_launch")
def test_serve_profile_folders(capsys: pytest.CaptureFixture[str], files: Path,
                               monkeypatch: pytest.MonkeyPatch) -> None:
    assert failed(capsys, "serve", "p", "--profiles", str(files / "folder")).endswith(
        f"no profile 'p': {files / 'folder'} holds no *.json profiles")
    (files / "folder" / "p.json").write_bytes(b"\xff")
    assert "p.json is not UTF-8 text" in failed(capsys, "serve", "p", "--profiles", str(files / "folder"))
    monkeypatch.chdir(files)
    assert "no suites/serving/profiles here: run from the project root or pass --profiles DIR" in failed(
        capsys, "serve", "p")


# --------------------------------------------------------------------------------------------- as a user runs it
def test_no_traceback_as_a_process(files: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "pytest_moeperf.cli", "topology", "--topology",
                           str(files / "folder")], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 2
    assert done.stderr == f"moeperf topology: topology file {files / 'folder'} is a directory, not a file\n"
