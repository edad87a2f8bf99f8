"""Where a session's numbers come from besides the machine: the git commit and branch of the project measured, and
the environment variables that change what the code does."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

#: environment variables that change what the measured code does (collectives, vLLM, CUDA, torch, the CPU's
#: threading and BLAS, Triton; the test-only injection plugin): a run with other values ran other code
PERF_ENV_PREFIXES = ("NCCL_", "VLLM_", "CUDA_", "TORCH_", "PYTORCH_", "TRITON_", "NVIDIA_", "OMP_", "KMP_", "GOMP_",
                     "MKL_", "ONEDNN_", "DNNL_", "OPENBLAS_", "MOEPERF_INJECT")


def perf_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables of ``environ`` that can change the numbers (`PERF_ENV_PREFIXES`), less cache locations."""
    return {k: v for k, v in sorted(environ.items()) if k.startswith(PERF_ENV_PREFIXES) and "CACHE" not in k}


def git_commit_info(root: Path) -> dict[str, Any]:
    """The commit, its times, whether the tree is dirty, the project and the branch of ``root``'s checkout.

    The branch is CI's when it says (a pull request's head branch, ``GITHUB_HEAD_REF``; else ``GITHUB_REF_NAME``),
    since a CI checkout is a detached HEAD."""

    def git(*args: str) -> str:
        try:
            done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return ""
        return done.stdout.strip() if done.returncode == 0 else ""

    sha = git("rev-parse", "HEAD")
    branch = os.environ.get("GITHUB_HEAD_REF") or os.environ.get("GITHUB_REF_NAME") or git(
        "rev-parse", "--abbrev-ref", "HEAD") or None
    return {"id": sha or None, "time": git("log", "-1", "--format=%cI") or None,
            "author_time": git("log", "-1", "--format=%aI") or None,
            # without a commit, whether the tree is dirty is unknown too (None), not "clean"
            "dirty": bool(git("status", "--porcelain", "--untracked-files=no")) if sha else None,
            "project": root.name, "branch": branch}
