"""Check that the plugin works on an install without extras (run by ``tox -e minimal``, ``minimal-cpu``,
``minimal-serving``).

The plugin auto-loads through its ``pytest11`` entry point into every pytest run of the environment it is
installed in, so an optional dependency imported at registration would break every test suite of the user. This
runs, in a fresh directory outside the checkout: ``pytest --help`` (the moeperf options must be listed), then a
one-test session that records a metric with ``perf.record`` (it must pass, with the metric NEW), then the same
session again with ``--moeperf-update`` and once more against the stored baseline.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).parent


def run(args: list[str], cwd: Path) -> str:
    done = subprocess.run([sys.executable, "-m", "pytest", *args], cwd=cwd, capture_output=True, text=True)
    out = done.stdout + done.stderr
    if done.returncode != 0:
        raise SystemExit(f"pytest {' '.join(args)} exited {done.returncode}:\n{out}")
    return out


def main() -> int:
    present = [m for m in ("torch", "aiohttp", "vllm", "pynvml", "prometheus_client") if importlib.util.find_spec(m)]
    print(f"optional modules present in this environment: {present or 'none'}")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        shutil.copy(HERE / "minimal_perf.py", work / "test_minimal_perf.py")
        help_text = run(["--help"], work)
        for option in ("--moeperf-baselines", "--moeperf-update", "--moeperf-tolerance", "--moeperf-topology"):
            if option not in help_text:
                raise SystemExit(f"pytest --help does not list {option}:\n{help_text}")
        common = ["-p", "no:cacheprovider", "-q", "--moeperf-baselines", str(work / "baselines")]
        first = run([*common, "test_minimal_perf.py"], work)
        if "1 passed" not in first or "NEW" not in first:
            raise SystemExit(f"expected one passing test with a NEW metric:\n{first}")
        run([*common, "--moeperf-update", "test_minimal_perf.py"], work)
        stored = list((work / "baselines").glob("*/test_minimal_perf.json"))
        if not stored:
            raise SystemExit("--moeperf-update wrote no baseline file")
        again = run([*common, "test_minimal_perf.py"], work)
        if "1 passed" not in again:
            raise SystemExit(f"the run against the stored baseline did not pass:\n{again}")
    print("base install: pytest --help lists the moeperf options; perf.record, update and compare work")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
