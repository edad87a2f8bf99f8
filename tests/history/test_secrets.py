"""No fragment of a PostgreSQL password in any message of any command (issue 37, item 2): the driver's own error
text quotes what it failed to parse (``invalid percent-encoded token: "SEC%RET7"``, the whole URL of an open
``[``), so every text derived from it is scrubbed, for malformed URLs too, and for a password that is a common word.
The errors come from the real driver (psycopg / libpq) and the real commands; a real PostgreSQL server where one
applies."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from urllib.parse import quote

import pytest

from pytest_moeperf import cli
from pytest_moeperf.history.store import HistoryError, HistoryStore
from pytest_moeperf.history.targets import FRAGMENT, redact, scrub, secrets

SOCKET = "/nonexistent-moeperf-socket-dir"  # no server there; a fixed name holds no piece of a password below
# (URL with {sock} for a folder without a server's socket, the password the user meant)
LEAKY = [
    ("postgresql://u:SEC%RET7@127.0.0.1:1/db", "SEC%RET7"),  # the issue's: a bad percent escape
    ("postgresql://u:SECRET1@[::1/db", "SECRET1"),  # the issue's: an open '[' (libpq printed the whole URL)
    ("postgres://u:Qv8@Zk3x@127.0.0.1:1/db", "Qv8@Zk3x"),  # an '@' in the password: libpq reads 'Zk3x@…' as host
    ("postgresql://u:Jw5/Hn2q@{sock}/db", "Jw5/Hn2q"),  # a '/' in the password
    ("postgresql://u@/db?host={sock}&port=1&password=Tp4&Lm9x&connect_timeout=2", "Tp4&Lm9x"),  # an '&' in it
    ("postgresql://u@/db?host={sock}&port=1&password=Rc6%zz", "Rc6%zz"),  # a bad escape in the query
    ("postgresql://u:Kd3Vb7Wn@/db?host={sock}&port=1&connect_timeout=2", "Kd3Vb7Wn"),  # well formed, unreachable
    ("postgresql://u:server@/db?host={sock}&port=1&connect_timeout=2", "server"),  # a common word: libpq's own
]


COMMON = {"server"}  # our own words ("every", "version") hold pieces of these: only the whole word is looked for


def leaks(text: str, password: str) -> list[str]:
    """The pieces of ``password`` (`FRAGMENT` characters and up; a common word: whole) that ``text`` holds."""
    size = len(password) if password in COMMON else min(FRAGMENT, len(password))
    return sorted({password[i:i + size] for i in range(len(password) - size + 1) if password[i:i + size] in text})


def urls() -> list[tuple[str, str]]:
    return [(url.format(sock=SOCKET), password) for url, password in LEAKY]


@pytest.mark.parametrize("index", range(len(LEAKY)))
def test_the_drivers_errors_hold_no_fragment_of_the_password(tmp_path: Path, index: int) -> None:
    pytest.importorskip("psycopg")
    url, password = urls()[index]
    for opening in (HistoryStore.open, HistoryStore.read):
        with pytest.raises(HistoryError) as raised:
            opening(url)
        message = str(raised.value)
        assert message.startswith(f"cannot open history {redact(url)}: "), message
        assert "***" in message and not leaks(message, password), message


def test_a_common_word_is_redacted_anyway_from_the_drivers_text() -> None:
    url = "postgresql://u:server@/db?host=/x"
    assert scrub('connection to server on socket "/x/.s.PGSQL.1" failed: Is the server running?', url) == \
        'connection to *** on socket "/x/.s.PGSQL.1" failed: Is the *** running?'
    assert scrub('invalid URI query parameter: "Lm9x"', "postgresql://h/db?password=Tp4&Lm9x") == \
        'invalid URI query parameter: "***"', "a quoted piece of a password, however short"
    assert secrets("postgresql://u:p%40ss@h/db?sslpassword=a%26b") == ["p%40ss", "a%26b", "p@ss", "a&b"]


@pytest.mark.parametrize("command", ["list", "show", "trend", "dashboard"])
def test_no_command_prints_a_fragment_of_the_password(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                      command: str) -> None:
    pytest.importorskip("psycopg")
    for url, password in urls():
        argv = {"list": ["history", "--db", url, "list"], "show": ["history", "--db", url, "show", "x"],
                "trend": ["trend", "--db", url, "x"],
                "dashboard": ["dashboard", "--db", url, "--out", str(tmp_path / "site")]}[command]
        assert cli.main(argv) == 2
        captured = capsys.readouterr()
        output = captured.out + captured.err
        assert "cannot open history" in output and not leaks(output, password), output


def test_the_issues_command_as_a_process(tmp_path: Path) -> None:
    pytest.importorskip("psycopg")
    done = subprocess.run([sys.executable, "-m", "pytest_moeperf.cli", "history", "--db",
                           "postgresql://u:SEC%RET7@127.0.0.1:1/db", "list"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip() == ("moeperf history: cannot open history postgresql://u:***@127.0.0.1:1/db: "
                                   'ProgrammingError: invalid percent-encoded token: "***"'), done.stderr


def test_a_session_warns_without_a_fragment_of_the_password(pytester: pytest.Pytester, run_moeperf,  # type: ignore[no-untyped-def]
                                                            tmp_path: Path) -> None:
    """The session reads the history for its noise model and writes it at its end: two warnings, both clean."""
    pytest.importorskip("psycopg")
    pytester.makepyfile("def test_t(perf):\n    perf.record('t', [1.0, 1.1, 0.9], unit='us')\n")
    for url, password in urls():
        result = run_moeperf("--moeperf-history", url, "-W", "always")
        result.assert_outcomes(passed=1)
        output = result.stdout.str() + result.stderr.str()
        assert "moeperf history not written: cannot open history" in output, output
        assert not leaks(output, password), (url, leaks(output, password), output)


def test_a_real_server_shows_its_url_without_the_password(pytester: pytest.Pytester, run_moeperf,  # type: ignore[no-untyped-def]
                                                          pg_target: str, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """A real PostgreSQL (trust authentication, so any password connects): the session records to it and says
    where, `moeperf history` and `moeperf dashboard` read it (the password also written raw, not percent-encoded),
    the server refuses a database that does not exist; no fragment anywhere."""
    password = "Hx7#Wq2e"
    url = pg_target.replace("postgresql://postgres@", f"postgresql://postgres:{quote(password, safe='')}@", 1)
    assert url != pg_target
    pytester.makepyfile("def test_t(perf):\n    perf.record('t', [1.0, 1.1, 0.9], unit='us')\n")
    result = run_moeperf("--moeperf-history", url, "-W", "error::UserWarning")
    result.assert_outcomes(passed=1)
    output = result.stdout.str() + result.stderr.str()
    assert "history: this run appended to postgresql://postgres:***@/" in output, output
    assert cli.main(["history", "--db", url, "list"]) == 0
    assert cli.main(["history", "--db", url.replace(quote(password, safe=""), password), "list"]) == 0  # a raw '#'
    assert cli.main(["history", "--db", url.replace("/moeperf_test?", "/no_such_db?"), "list"]) == 2  # the server's
    assert cli.main(["dashboard", "--db", url, "--out", str(tmp_path / "site")]) == 0
    captured = capsys.readouterr()
    everything = output + captured.out + captured.err + (tmp_path / "site" / "data" / "sessions.js").read_text()
    assert captured.out.count("1 run(s) in postgresql://postgres:***@/") == 2, captured.out
    assert 'database "no_such_db" does not exist' in captured.err, captured.err
    for shown in (password, quote(password, safe="")):
        assert not leaks(everything, shown), (leaks(everything, shown), everything[-3000:])
