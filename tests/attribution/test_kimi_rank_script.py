"""``scripts/gpu-kimi-rank.sh`` on a user's box (issue 37 item 19): it uses the vLLM its python imports, or one
installed with ``pip install --target`` into the folder ``SITE`` names, and says so before anything starts when there
is none. The vLLM here is a stand-in package (its version is what the script notes); the run is the script's real
flow with no time left (``DEADLINE=0``: the serve start gives up, the suite's starts are skipped, the budget runs)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).parents[2]
SCRIPT = REPO / "scripts" / "gpu-kimi-rank.sh"


def run(tmp_path: Path, site: Path | None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OUT": str(tmp_path / "out"), "W": str(tmp_path / "w"), "PY": sys.executable,
           "DEADLINE": "0", "PROFILE": "cpu-tiny-nospec", "BATCHES": "1",
           "MOEPERF_SERVE_CACHE": str(tmp_path / "cache")}
    env.pop("SITE", None)
    if site is not None:
        env["SITE"] = str(site)
    return subprocess.run(["bash", str(SCRIPT)], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


def stand_in(site: Path, body: str) -> Path:
    (site / "vllm").mkdir(parents=True)
    (site / "vllm" / "__init__.py").write_text(body)
    return site


def test_the_vllm_of_site_is_the_one_used(tmp_path: Path) -> None:
    site = stand_in(tmp_path / "site", '__version__ = "0.0-site-test"\n')
    done = run(tmp_path, site)
    assert done.returncode == 0, done.stdout + done.stderr
    notes = (tmp_path / "out" / "notes.txt").read_text()
    assert f"vllm 0.0-site-test at {site / 'vllm' / '__init__.py'}" in notes.splitlines()[0]
    assert "starts 2-3: skipped" in notes and "budget tables: 2 in budget.md" in notes


@pytest.mark.parametrize("case", ["broken", "not a folder"])
def test_without_an_importable_vllm_nothing_starts(tmp_path: Path, case: str) -> None:
    if case == "broken":
        site = stand_in(tmp_path / "site", 'raise ImportError("no vLLM here")\n')
        expected = f"gpu-kimi-rank.sh: {sys.executable} cannot import vLLM (ImportError: no vLLM here)"
    else:
        site = tmp_path / "missing"
        expected = f"gpu-kimi-rank.sh: SITE={site} is not a folder"
    done = run(tmp_path, site)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.startswith(expected), done.stderr
    assert not (tmp_path / "out").exists() and not (tmp_path / "w").exists()
