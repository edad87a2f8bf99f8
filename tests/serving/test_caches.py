"""What a start reuses: vLLM's, Triton's and Inductor's caches under the project's cache (a variable the user or the
profile set wins), and vLLM's bytecode: left where Python puts it when vLLM has some or Python may write it, else
written under the project's cache and compiled there before the first start (real ``compileall`` runs)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from pytest_moeperf.serving import cli as serve_cli
from pytest_moeperf.serving.lifecycle.caches import COMPILED_DIR, bytecode_plan, cache_env, precompile
from pytest_moeperf.serving.lifecycle.starts import StartKit
from pytest_moeperf.serving.models.profiles import ServeProfile

TAG = sys.implementation.cache_tag


def test_compile_caches_go_under_the_project_cache_unless_the_user_or_the_profile_chose(tmp_path: Path) -> None:
    root = tmp_path / "0.26.0"
    assert cache_env(root, {}, {}) == {"VLLM_CACHE_ROOT": str(root / "vllm"), "TRITON_CACHE_DIR": str(root / "triton"),
                                       "TORCHINDUCTOR_CACHE_DIR": str(root / "inductor")}
    mine = cache_env(root, {"TRITON_CACHE_DIR": "/p"}, {"VLLM_CACHE_ROOT": "/u"})
    assert mine == {"TORCHINDUCTOR_CACHE_DIR": str(root / "inductor")}


def test_a_kit_gives_each_server_the_versions_cache(tmp_path: Path) -> None:
    kit = StartKit(tmp_path, environ={"PATH": os.environ.get("PATH", "")})
    assert kit.root is not None and kit.root.parent == tmp_path and kit.root.name  # the vLLM version
    env = kit.env(ServeProfile(name="p", model="tiny-moe"))
    assert env["VLLM_CACHE_ROOT"] == str(kit.root / "vllm")
    assert StartKit(None).env(ServeProfile(name="p", model="tiny-moe")) == {}  # vLLM's defaults


def _package(tmp_path: Path, compiled: bool) -> Path:
    package = tmp_path / "site" / "fakevllm"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("VALUE = 1\n")
    (package / "sub.py").write_text("OTHER = 2\n")
    if compiled:
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(package)], check=True,
                       env={**os.environ, "PYTHONDONTWRITEBYTECODE": ""})
    return package


def test_bytecode_beside_the_sources_is_used_as_it_is(tmp_path: Path) -> None:
    package = _package(tmp_path, compiled=True)
    plan = bytecode_plan(package, tmp_path / "pycache", {"PYTHONDONTWRITEBYTECODE": "1"})
    assert plan.env == {} and plan.marker == package / "__pycache__" / f"__init__.{TAG}.pyc"
    assert plan.marker.exists()


def test_without_bytecode_and_with_python_writing_none_it_goes_under_the_project_cache(tmp_path: Path) -> None:
    package = _package(tmp_path, compiled=False)
    root = tmp_path / "pycache"
    plan = bytecode_plan(package, root, {"PYTHONDONTWRITEBYTECODE": "1"})
    assert plan.env == {"PYTHONPYCACHEPREFIX": str(root), "PYTHONDONTWRITEBYTECODE": ""}
    assert plan.marker is not None and root in plan.marker.parents and not plan.marker.exists()
    took = precompile(package, plan.env, workers=2)
    assert took > 0 and plan.marker.exists()
    assert not (package / "__pycache__").exists()  # nothing written beside the user's sources
    # a server process with the plan's environment finds it there: importing writes nothing new
    before = sorted(p.name for p in plan.marker.parent.iterdir())
    subprocess.run([sys.executable, "-c", "import fakevllm.sub"], check=True, cwd=tmp_path,
                   env={**os.environ, "PYTHONPATH": str(package.parent), "PYTHONDONTWRITEBYTECODE": "1", **plan.env})
    assert sorted(p.name for p in plan.marker.parent.iterdir()) == before


def test_without_bytecode_where_python_writes_it_the_first_start_does(tmp_path: Path) -> None:
    package = _package(tmp_path, compiled=False)
    plan = bytecode_plan(package, tmp_path / "pycache", {})
    assert plan.env == {} and plan.marker == package / "__pycache__" / f"__init__.{TAG}.pyc"


def test_the_users_prefix_wins(tmp_path: Path) -> None:
    package = _package(tmp_path, compiled=False)
    plan = bytecode_plan(package, tmp_path / "pycache", {"PYTHONPYCACHEPREFIX": str(tmp_path / "mine"),
                                                         "PYTHONDONTWRITEBYTECODE": "1"})
    assert plan.env == {} and plan.marker is not None and (tmp_path / "mine") in plan.marker.parents


SHARED_ROOT = """
from pathlib import Path

def test_where(serve):
    pool = serve.pool
    Path({out!r}).write_text(f"{{pool.model_cache}}\\n{{pool.kit.root.parent}}\\n")
"""


def test_a_shared_cache_root_is_the_one_moeperf_serve_uses(pytester, run_moeperf, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A suite's start under ``MOEPERF_SERVE_CACHE`` (``moeperf batch``, or set by hand) and ``moeperf serve`` keep
    models and compile caches in the same folders of ``.moeperf``: on 1x H200 the Kimi rank's ``moeperf serve``
    started warm (64 s) while the suite's start after it compiled everything again (129 s)."""
    root, out = pytester.path / ".moeperf", pytester.path / "where.txt"
    monkeypatch.setenv("MOEPERF_SERVE_CACHE", str(root))
    pytester.makepyfile(test_where=SHARED_ROOT.format(out=str(out)))
    run_moeperf().assert_outcomes(passed=1)  # without pytest's cache (-p no:cacheprovider), as a batch runs it
    serve_models = serve_cli._parser().parse_args(["tiny"]).model_cache  # moeperf serve's default: .moeperf/models
    assert serve_models.parent == Path(".moeperf")
    assert out.read_text().splitlines() == [str(root / serve_models.name), str(root / COMPILED_DIR)]
