"""Where a session's numbers come from besides the machine: the git commit and branch of the project measured, and
the environment variables that change what the code does."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

#: environment variables that change what the measured code does (collectives, vLLM, CUDA, torch, the CPU's
#: threading and BLAS, Triton; the test-only injection plugin): a run with other values ran other code
PERF_ENV_PREFIXES = ("NCCL_", "VLLM_", "CUDA_", "TORCH_", "PYTORCH_", "TRITON_", "NVIDIA_", "OMP_", "KMP_", "GOMP_",
                     "MKL_", "ONEDNN_", "DNNL_", "OPENBLAS_", "MOEPERF_INJECT")


def perf_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables of ``environ`` that can change the numbers (`PERF_ENV_PREFIXES`), less cache locations."""
    return {k: v for k, v in sorted(environ.items()) if k.startswith(PERF_ENV_PREFIXES) and "CACHE" not in k}


def _git(root: Path, *args: str, env: Mapping[str, str] | None = None, timeout: float = 10) -> str | None:
    """git's output in ``root`` (stripped), or None when it failed."""
    try:
        done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=timeout,
                              env=None if env is None else {**os.environ, **env})
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def code_identity(root: Path, not_code: Sequence[str] = ()) -> str | None:
    """The git tree of ``root``'s checkout as it is on disk (its tracked files as they are now: an untracked file is
    no code until it is added, and a tool's stray output must not look like a change), less the paths ``not_code``
    names (git pathspecs relative to ``root``: the baselines directory, and what ``--moeperf-code-exclude`` says is
    not the measured code); None outside a git checkout or when git fails.

    Two runs with one identity ran the same code whatever their commits: an update commits its baselines, so the
    commit after it is never the commit its runs were measured at, and a tree dirty with nothing but baselines or
    notes measures what the clean one does. Built in a copy of the index: git's own is never touched."""
    index = _git(root, "rev-parse", "--path-format=absolute", "--git-path", "index")
    if not index or not Path(index).is_file():
        return None  # no index, no tracked files to read: an empty tree would match any other such checkout
    with tempfile.TemporaryDirectory(prefix="moeperf-code-") as tmp:
        scratch = Path(tmp) / "index"
        shutil.copyfile(index, scratch)  # its stat cache spares hashing the unchanged files again
        env = {"GIT_INDEX_FILE": str(scratch)}
        if _git(root, "add", "-u", "--", ".", env=env, timeout=120) is None:
            return None
        if not_code and _git(root, "rm", "-r", "-q", "--cached", "--ignore-unmatch", "--", *not_code, env=env,
                             timeout=60) is None:
            return None  # a pathspec git refuses (outside the checkout): unknown, never a wrong identity
        return _git(root, "write-tree", env=env, timeout=60) or None


def pathspecs(root: Path, paths: Sequence[Path]) -> list[str]:
    """``paths`` (absolute, or relative to the current directory; glob patterns allowed) as git pathspecs relative
    to ``root``; those outside it, and ``root`` itself, left out (not its files, or all of them)."""
    top, out = root.resolve(), []
    for path in paths:
        try:
            relative = Path(path).resolve().relative_to(top).as_posix()
        except ValueError:
            continue
        if relative not in ("", "."):
            out.append(relative)
    return out


def git_commit_info(root: Path, not_code: Sequence[str] | None = None) -> dict[str, Any]:
    """The commit, its times, whether the tree is dirty, the project and the branch of ``root``'s checkout; with
    ``not_code`` (pathspecs, `code_identity`), also the identity of the code on disk (``code``).

    The branch is CI's when it says (a pull request's head branch, ``GITHUB_HEAD_REF``; else ``GITHUB_REF_NAME``),
    since a CI checkout is a detached HEAD."""

    def git(*args: str) -> str:
        return _git(root, *args) or ""

    sha = git("rev-parse", "HEAD")
    branch = os.environ.get("GITHUB_HEAD_REF") or os.environ.get("GITHUB_REF_NAME") or git(
        "rev-parse", "--abbrev-ref", "HEAD") or None
    return {"id": sha or None, "time": git("log", "-1", "--format=%cI") or None,
            "author_time": git("log", "-1", "--format=%aI") or None,
            # without a commit, whether the tree is dirty is unknown too (None), not "clean"
            "dirty": bool(git("status", "--porcelain", "--untracked-files=no")) if sha else None,
            "project": root.name, "branch": branch,
            **({"code": code_identity(root, not_code) if sha else None} if not_code is not None else {})}
