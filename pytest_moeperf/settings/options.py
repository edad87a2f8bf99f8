"""The `moeperf` options: one table feeds the CLI flags, their ini twins and the frozen `Settings`."""

from __future__ import annotations

import argparse
import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pytest_moeperf.settings import configfile
from pytest_moeperf.settings.checks import (
    parse_bool,
    parse_confirm_at,
    parse_cores,
    parse_count,
    parse_factor,
    parse_floor,
    parse_fraction,
    parse_milliseconds,
    parse_name,
    parse_noise_runs,
    parse_paths,
    parse_percent,
    parse_pids,
    parse_positive,
    parse_seconds,
    parse_server_urls,
    parse_starts,
)


def parse_emulation(text: str) -> str | None:
    """An interconnect emulation name (``emulation.py``), or ``none``."""
    from pytest_moeperf.machine import emulation

    name = text.strip().lower()
    if name in ("", "none", "off"):
        return None
    if name not in emulation.EMULATIONS:
        raise argparse.ArgumentTypeError(f"unknown interconnect emulation {text!r}; known: "
                                         f"{', '.join(emulation.names())}, none")
    return name


def parse_benchmark(text: str) -> str:
    """The unit pytest-benchmark's results are adopted in (``s``, ``ms``, ``us``, ``ns``; ``on``: ``s``), or ``off``:
    not adopted."""
    from pytest_moeperf.adoption.results import OFF, UNITS

    name = text.strip().lower()
    if name in (OFF, "no", "false", "0", "none"):
        return OFF
    if name in ("on", "yes", "true", "1"):
        return UNITS[0]
    name = {"µs": "us", "μs": "us"}.get(name, name)
    if name not in UNITS:
        raise argparse.ArgumentTypeError(f"expected a time unit ({', '.join(UNITS)}), on or off, got {text!r}")
    return name


def parse_dirs(text: str) -> tuple[Path, ...]:
    """Directories separated by os.pathsep (or one per ini line)."""
    return tuple(Path(p) for line in text.splitlines() for p in line.split(os.pathsep) if p.strip())


def _parse_acceptance_lengths(text: str) -> tuple[tuple[int | None, tuple[float, ...]], ...]:
    from pytest_moeperf.serving.models.acceptance import parse_acceptance_lengths  # the serving wing's syntax

    return parse_acceptance_lengths(text)


def _parse_history(text: str) -> str | Path:
    from pytest_moeperf.history.plugin import parse_history_option  # the history wing owns its target syntax

    return parse_history_option(text)


#: ``--moeperf-starts auto`` on a machine with GPUs. Two server starts of one profile on one 1x H200 differed by up to
#: 14 % in the server's own TPOT (another host: 3 starts within 5 % in 11 of 12 figures), so a start is the unit and a
#: verdict needs several; the rank test against m stored runs with k starts can reach p = 1/C(m+k, k): k = 3 reaches
#: p < 0.05 against 4 or more runs (1/35 against 4, 4 arrangements of 84 against 6: two sittings of 3 starts). Three
#: cold starts of the TP=1 serving plan take ~975 s on 1x H200 (one measured: 324 s; suites/serving/README.md, "Time"):
#: a 600 s batch measures the first and does not begin the second (`processes.rounds.Children.begins`)
GPU_STARTS = 3


@dataclass(frozen=True)
class Option:
    """One option: ``--moeperf-<name>`` on the command line and ``moeperf_<name>`` in the ini file."""

    name: str
    field: str
    help: str
    metavar: str | None  # None: a flag
    parse: Callable[[str], Any]
    default: Any
    repeat: bool = False  # may be given several times; parse returns a tuple, the values are concatenated

    @property
    def flag(self) -> str:
        return f"--moeperf-{self.name}"

    @property
    def ini(self) -> str:
        return f"moeperf_{self.name.replace('-', '_')}"


OPTIONS: tuple[Option, ...] = (
    Option("baselines", "baselines_dir", "directory of stored baselines (given on the command line: relative to the "
           "current directory; in the ini file: to the ini file)", "DIR", Path, Path("baselines")),
    Option("update", "update", "write or refresh this fingerprint's baselines from this run "
           "(only the metrics that ran)", None, parse_bool, False),
    Option("report", "report", "write a JSON report in the pytest-benchmark schema to PATH", "PATH", Path, None),
    Option("markdown", "markdown", "write a Markdown summary to PATH (e.g. $GITHUB_STEP_SUMMARY)",
           "PATH", Path, None),
    Option("topology", "topology_file", "use a recorded or hand-written topology FILE instead of probing "
           "(simulates another box: collection and markers behave as there, measurements skip)",
           "FILE", Path, None),
    Option("tolerance", "tolerance", "the minimum effect: the smallest relative change worth failing for, a "
           "fraction below 1 (0.05) or a percentage (5%) (unset: 5 %, which quiet metrics may lower to "
           "--moeperf-quiet-floor)", "FRAC", parse_fraction, None),
    Option("server-url", "server_urls", "measure the running OpenAI-compatible vLLM server at URL instead of "
           "launching servers (repeatable; NAME=URL names it, reference=URL and candidate=URL pair two servers "
           "for the spec-decode speedup)", "[NAME=]URL", parse_server_urls, (), repeat=True),
    Option("server-pid", "server_pids", "count process PID and its descendants as the attached server's for the "
           "health gate, when its listening port does not name it here (another user's server, a container); "
           "repeatable", "PID", parse_pids, (), repeat=True),
    Option("lock-timeout", "lock_timeout_s", "seconds --moeperf-update waits for the baselines directory's lock "
           "while another update or merge holds it (the holder is named every 30 s) before it gives up, writing "
           "nothing", "SECONDS", parse_seconds, 600.0),
    Option("server-timeout", "server_timeout_s", "seconds to wait for a launched server's /health",
           "SECONDS", parse_seconds, 600.0),
    Option("rank-timeout", "rank_timeout_s", "seconds before a multi-process run is declared hung and killed",
           "SECONDS", parse_seconds, 180.0),
    Option("quick", "quick", "fewer cases and repetitions (smoke runs)", None, parse_bool, False),
    Option("gpu-warmup-ms", "gpu_warmup_ms", "untimed warm-up of each GPU kernel case, in milliseconds of graph "
           "replays (0: 3 replays). 200 settles the SM clock before timing: on 1x H200 it took the spread of "
           "compute-bound bf16 GEMMs between processes from p90 11 % to 2.8 %, and reads them up to 16 % slower "
           "(the steady clock); baselines recorded without it do not compare", "MS", parse_milliseconds, 0.0),
    Option("window-requests", "window_requests", "requests on the plateau of each serving and spec-decode window "
           "(its ramp and drain, C requests each, come on top) instead of the profile's requests (or the suite's "
           "count for its device); a plateau still grows to what its gated percentiles need (p90: 29, p99: 299) and, "
           "on a GPU, to 10 drift blocks of C, and --moeperf-quick halves it; its metrics name the size in their "
           "workload, so baselines of the default size are not compared. For attached servers "
           "(--moeperf-server-url, moeperf ab --serve), which have no profile of their own", "N", parse_positive,
           None),
    Option("deadline", "deadline_s", "wall-clock seconds from the session's start after which the remaining perf "
           "tests skip, so a batch with a fixed time slot still ends normally and writes its reports and baselines; "
           "a child round or start that an earlier one shows cannot end before it is not begun",
           "SECONDS", parse_seconds, None),
    Option("strict", "strict", "INCONCLUSIVE and MISSING metrics (and a baseline from a machine of another "
           "fingerprint hash) fail the session", None, parse_bool, False),
    Option("noise-runs", "noise_runs", "run summaries a baseline keeps per metric to learn its between-run noise "
           "(record them in more than one sitting: rounds of one update share the box's state)",
           "K", parse_noise_runs, 15),
    Option("noise-k", "noise_k", "a metric's threshold is at least this many between-run spreads (robust σ of the "
           "stored run medians)", "K", parse_factor, 3.0),
    Option("rounds", "rounds", "measure N independent rounds, each a separate pytest process, and judge (or "
           "--moeperf-update) with all of them", "N", parse_positive, 1),
    Option("starts", "starts", "server starts the tests that measure a start run on (the serving and spec-decode "
           "tests on servers this session launches): S child sessions, each starting its own servers, each window one "
           "observation of its start (a re-run on the same server is not an independent round, so those tests are "
           "never confirmed in-process); with --moeperf-rounds N they get max(N, S) rounds; auto: "
           f"{GPU_STARTS} on a machine with GPUs, 1 without (one start against 3 or more stored runs can PASS but "
           "never reach the rank test's p < 0.05: such a verdict beyond its mde is INCONCLUSIVE)", "S|auto",
           parse_starts, None),
    Option("windows", "windows", "measurement windows of each test that measures a start, on that one start (the "
           "level below the start: each window one round, kept apart in the stored run); auto: planned with "
           "--moeperf-starts auto from the stored starts' variance per level (windows are the unit of a verdict only "
           "where the stored starts, of 2 or more sittings, show a start adds nothing beyond its windows), else 1",
           "W|auto", parse_starts, None),
    Option("confirm", "confirm", "the confirmation budget: measure a test whose metric crosses its threshold again, "
           "alone in up to R fresh child sessions (never in its own process, whose re-runs copy its state), while "
           "more rounds can still decide it (against 3 stored runs a rank test needs 4 rounds), then judge it on all "
           "its rounds; with --moeperf-rounds, extra rounds of the unsettled tests", "R", parse_count, 3),
    Option("confirm-at", "confirm_at", "when a test that crossed its threshold is confirmed: end (after the others "
           "and the starts; its report waits) or call (right after it)", "end|call", parse_confirm_at, "end"),
    Option("quiet-floor", "quiet_floor", "the smallest mde of a quiet metric: one whose baseline runs come from this "
           "host in 2 or more sittings (updates an hour or a reboot apart) and whose noise term is below the minimum "
           "effect (unset: 3 %, or 2 % when every metric is measured in 3 or more processes, --moeperf-rounds 3; "
           "off: the minimum effect is always the floor); a fraction below 1 (0.02) or a percentage (2%)", "FRAC|off",
           parse_floor, None),
    Option("host-id", "host_id", "name this host in the baselines it records and judges against (containers and "
           "runner pools whose machine id is not stable); default: a hash of the machine id and the GPUs' UUIDs",
           "NAME", parse_name, None),
    Option("code-exclude", "code_exclude", "paths of the checkout that are not the measured code (docs, the "
           "plugin's own tests; glob patterns allowed; repeatable, or whitespace-separated): a change there leaves "
           "a run on the code of the baselines' runs, so a family that moved as a whole is the machine (the "
           "baselines directory never counts)", "PATH", parse_paths, (), repeat=True),
    Option("accept-shift", "accept_shift", "let --moeperf-update re-record metric families that moved together "
           "(the machine-shift report: usually the machine, not the code)", None, parse_bool, False),
    Option("history", "history", "append this session's metrics, verdicts and provenance to a history database: a "
           "SQLite PATH, a postgresql:// URL, or off; unset: .moeperf/history.sqlite beside the baselines directory",
           "URL|PATH|off", _parse_history, None),
    Option("html", "html", "write a self-contained HTML report (topology, change chart, sortable verdict table, "
           "trends of flagged metrics) to PATH", "PATH", Path, None),
    Option("health", "health", "judge each measurement window's health (foreign CPU load, steal, GPU throttling "
           "and other GPU processes); a window that fails is INCONCLUSIVE", "on|off", parse_bool, True),
    Option("canary", "canary", "read the canary (fixed CPU and GPU workloads no code change touches, about a second "
           "a reading) before and after each test file's perf tests and beside a test that regressed; store its "
           "figures with the baselines and the history; a family that moved with a canary that moved beyond its "
           "stored spread reads INCONCLUSIVE, cause machine", "on|off", parse_bool, True),
    Option("health-foreign-cores", "health_foreign_cores", "the health gate trips when processes outside the "
           "test's process tree keep more than CORES cores busy during the window; auto: 3.5 percent of the CPUs this "
           "process may use, at least 0.07", "CORES|auto", parse_cores, None),
    Option("health-steal", "health_steal_pct", "the health gate trips when the hypervisor steals more than PCT percent "
           "of the window's CPU time", "PCT", parse_percent, 10.0),
    Option("share-gpus", "share_gpus", "allow more xdist workers than GPUs: workers share GPUs and take turns "
           "measuring on them", None, parse_bool, False),
    Option("profiles", "profile_dirs", "directories of serve profiles (*.json) the serving and spec-decode suites "
           "run (repeatable, or os.pathsep-separated); unset: the directories the suites name (the "
           "pytest_moeperf_profile_dirs hook)", "DIR", parse_dirs, (), repeat=True),
    Option("benchmark", "benchmark_unit", "adopt pytest-benchmark's results: each test's `benchmark` fixture result "
           "becomes its metric 'time' in UNIT (s, ms, us, ns; on: s), judged, confirmed, stored and reported like a "
           "perf.record metric (pytest-benchmark's own options and outputs are unchanged); off: left to "
           "pytest-benchmark alone", "UNIT|on|off", parse_benchmark, "s"),
    Option("acceptance-lengths", "acceptance_lengths", "run every serve profile that pins its speculative "
           "acceptance (rejection_sample_method synthetic) also at these mean acceptance lengths, each a variant "
           "<profile>+al<L> with its own server start (the profile file unchanged): L,L,... for every pinned profile, "
           "or kN=L,L,... for those of N speculative tokens (several groups separated by spaces or ';'); each L in "
           "[1, N + 1]. Three points of a profile and its reference at a concurrency give the break-even acceptance",
           "[kN=]L,...", _parse_acceptance_lengths, ()),
    Option("interconnect-emulation", "emulation", "take NVLink (pcie-no-p2p) or also host shared memory "
           "(pcie-socket) away from NCCL in the all-reduce ranks and launched servers, as a labelled stand-in for a "
           "PCIe box without peer-to-peer; baselines are keyed apart (<slug>+NAME)", "NAME|none", parse_emulation,
           None),
)

#: Set by a ``--moeperf-rounds`` parent in each child's environment: the round ("i/N"); the child writes no
#: baselines and no Markdown (the parent does, once, from all rounds).
ROUND_ENV = "MOEPERF_ROUND"
#: Set by a ``--moeperf-starts`` parent in each child's environment when it planned the windows a start
#: (``--moeperf-windows auto``): the windows each child measures a start in.
WINDOWS_ENV = "MOEPERF_WINDOWS"
#: Set by a parent in each child's environment under ``--moeperf-deadline``: the session's deadline as a Unix time,
#: so that the deadline counts from the session's start across its rounds and starts, not from each child's.
DEADLINE_ENV = "MOEPERF_DEADLINE_AT"


@dataclass(frozen=True)
class Settings:
    """Every `moeperf` option, resolved once per session (CLI beats ini beats default)."""

    baselines_dir: Path
    update: bool
    report: Path | None
    markdown: Path | None
    topology_file: Path | None
    tolerance: float | None  # None: the default minimum effect (thresholds.DEFAULT_TOLERANCE)
    server_urls: tuple[str, ...]
    server_timeout_s: float
    rank_timeout_s: float
    quick: bool
    deadline_s: float | None
    profile_dirs: tuple[Path, ...]
    strict: bool
    noise_runs: int
    noise_k: float
    rounds: int
    confirm: int
    quiet_floor: float | None  # None: by the processes (`quiet_floor_of`); inf: off
    host_id: str | None
    accept_shift: bool
    health: bool
    health_foreign_cores: float | None  # None: auto (`health.auto_foreign_cores`)
    health_steal_pct: float
    share_gpus: bool
    history: str | Path | None = None
    html: Path | None = None
    emulation: str | None = None
    round_of: str | None = None  # "i/N" in a --moeperf-rounds child
    server_pids: tuple[int, ...] = ()
    gpu_warmup_ms: float = 0.0
    window_requests: int | None = None  # None: the profile's, else the suite's per-device count
    starts: int | None = None  # None: auto (`starts_of`)
    windows: int | None = None  # None: auto (planned with starts auto, else 1: `processes.windows`)
    deadline_at: float | None = None  # a child's: the session's deadline as a Unix time (`DEADLINE_ENV`)
    lock_timeout_s: float = 600.0
    benchmark_unit: str = "s"  # "off": pytest-benchmark's results are not adopted (`adoption`)
    #: ``--moeperf-acceptance-lengths``: (speculative tokens or None for all, lengths) per group
    acceptance_lengths: tuple[tuple[int | None, tuple[float, ...]], ...] = ()
    canary: bool = True
    confirm_at: str = "end"
    code_exclude: tuple[Path, ...] = ()  # paths of the checkout that are not the measured code (`same_code`)


#: the quiet floor when none is given: a session of one process, and one whose metrics are each measured in
#: `QUIET_PROCESSES` or more processes (``--moeperf-rounds``). Measured on 1x H200 (95 DeepSeek-V3 GEMM cases, 3
#: updates of 3 processes, each judged against the other two, docs/measurements/h200-2026-12-01-c.md; recorded minutes
#: apart, which is one sitting now, so replayed as if 2 h apart: real sittings may spread wider): at 2 %, 0 of 1,140
#: A/A metrics flagged, GEMM ``time`` x 1.05 caught 95 %, x 1.03 87 %; at 3 %, x 1.03 14 %. Sessions
#: of one process keep 3 %: between processes a case moves up to 2-3 % (p90 2.8 %), which a single process
#: cannot average out (at 2 % it raised tflops false flags to 0.8-1.25 %).
QUIET_FLOOR = 0.03
QUIET_FLOOR_PROCESSES = 0.02
QUIET_PROCESSES = 3


def quiet_floor_of(settings: Settings) -> float | None:
    """The quiet floor a session judges with (None: off): the option, else by the processes behind each metric."""
    if settings.quiet_floor is not None:
        return settings.quiet_floor if settings.quiet_floor < math.inf else None
    # a --moeperf-rounds child is "i/N"; a moeperf ab child ("ab base 3") judges nothing that counts
    of_n = re.fullmatch(r"\d+/(\d+)", settings.round_of or "")
    processes = int(of_n[1]) if of_n else settings.rounds
    return QUIET_FLOOR_PROCESSES if processes >= QUIET_PROCESSES else QUIET_FLOOR



def starts_of(settings: Settings, gpus: int) -> int:
    """The starts a session measures its per-start tests on: the option, else `GPU_STARTS` with GPUs, 1 without."""
    if settings.starts is not None:
        return settings.starts
    return GPU_STARTS if gpus > 0 else 1


def _escaped(text: str) -> str:
    """argparse formats help with ``%``: a literal percent sign is written twice."""
    return text.replace("%", "%%")


def add_options(parser: pytest.Parser) -> None:
    group = parser.getgroup("moeperf", "MoE inference performance regression tests")
    for option in OPTIONS:
        default_text = "off" if option.metavar is None else ("unset" if option.default is None else option.default)
        if isinstance(option.default, tuple):
            default_text = ", ".join(str(d) for d in option.default) or "none"
        help_text = f"{option.help} (default: {default_text})"
        if option.repeat:
            group.addoption(option.flag, metavar=option.metavar, type=option.parse, action="append",
                            default=None, dest=option.ini, help=_escaped(help_text))
            parser.addini(option.ini, help_text, default=None)
        elif option.metavar is None:
            group.addoption(option.flag, action="store_true", default=None, dest=option.ini, help=_escaped(help_text))
            parser.addini(option.ini, help_text, type="bool", default=option.default)
        else:
            group.addoption(option.flag, metavar=option.metavar, type=option.parse, default=None,
                            dest=option.ini, help=_escaped(help_text))
            parser.addini(option.ini, help_text, default=None)


def resolve(config: pytest.Config) -> Settings:
    """CLI value, else ini value (parsed, errors name the ini key), else the default; paths from the ini file (or
    the default) against its directory, else the rootdir: the ones the command line meant (`configfile`)."""
    values: dict[str, Any] = {}
    ini_dir = configfile.ini_dir(config)
    for option in OPTIONS:
        value = config.getoption(option.ini)
        if option.repeat and value is not None:
            value = tuple(item for given in value for item in given)
        base = Path.cwd()  # a path given on the command line is relative to where pytest was started
        if value is None:
            base = ini_dir  # a path from the ini file (or the default) is relative to the ini file
            raw = configfile.ini_value(config, option.ini, flag=option.metavar is None)
            if isinstance(raw, bool):
                value = raw
            elif raw in (None, ""):
                value = option.default
            else:
                try:
                    value = option.parse(str(raw))
                except argparse.ArgumentTypeError as exc:
                    raise pytest.UsageError(f"ini option {option.ini}: {exc}") from None
        if isinstance(value, Path) and not value.is_absolute():
            # a topology may also be a bundled name such as 8x-rtx-pro-6000-pcie: leave it as given
            if option.field != "topology_file" or (base / value).exists():
                value = base / value
        if option.repeat:
            value = tuple(base / v if isinstance(v, Path) and not v.is_absolute() else v for v in value)
        values[option.field] = value
    deadline_at = os.environ.get(DEADLINE_ENV) or None
    if deadline_at is not None:
        try:
            values["deadline_at"] = float(deadline_at)
        except ValueError:
            raise pytest.UsageError(f"{DEADLINE_ENV}={deadline_at!r}: expected a Unix time") from None
    planned = os.environ.get(WINDOWS_ENV) or None
    if planned is not None and values.get("windows") is None:
        try:
            values["windows"] = parse_starts(planned)
        except argparse.ArgumentTypeError as exc:
            raise pytest.UsageError(f"{WINDOWS_ENV}={planned!r}: {exc}") from None
    round_of = os.environ.get(ROUND_ENV) or None
    if round_of is not None:  # a --moeperf-rounds child: the parent stores and writes Markdown
        values.update(update=False, markdown=None, rounds=1, confirm=0, round_of=round_of)
    return Settings(**values)
