"""The reference page names every option, ini key, marker and hook the code has, and neither it nor the README names
one it lacks."""

from __future__ import annotations

import re
from pathlib import Path

from pytest_moeperf import hookspec
from pytest_moeperf.plugin import MARKERS
from pytest_moeperf.settings import OPTIONS

README = (Path(__file__).parents[2] / "README.md").read_text()
REFERENCE = (Path(__file__).parents[2] / "docs" / "reference.md").read_text()


def test_every_option_and_its_ini_twin_is_documented() -> None:
    for option in OPTIONS:
        assert f"`{option.flag}" in REFERENCE, option.flag
        assert f"`{option.ini}`" in REFERENCE, option.ini
    for page in (README, REFERENCE):
        documented = set(re.findall(r"`(--moeperf-[a-z-]+)", page))
        assert documented <= {o.flag for o in OPTIONS}, documented - {o.flag for o in OPTIONS}


def test_every_marker_is_documented() -> None:
    for marker in MARKERS:
        name = marker.split("(")[0].split(":")[0]
        assert f"`{name}" in REFERENCE, name


def test_every_hook_is_documented() -> None:
    hooks = [name for name in dir(hookspec) if name.startswith("pytest_moeperf_")]
    assert hooks
    for name in hooks:
        assert f"`{name}(" in REFERENCE, name


ARCHITECTURE = (Path(__file__).parents[2] / "docs" / "ARCHITECTURE.md").read_text()
PACKAGE = Path(__file__).parents[2] / "pytest_moeperf"


def _package_modules() -> set[str]:
    """Every module of the package as a path relative to it (``kernels/gemm.py``, named in the document as
    ``pytest_moeperf/kernels/gemm.py``), ``__init__`` files aside."""
    return {str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py") if p.name != "__init__.py"}


def test_architecture_names_every_module_and_only_modules_that_exist() -> None:
    named = set(re.findall(r"`pytest_moeperf/((?:[a-z_]+/)*[a-z_0-9]+\.py)`", ARCHITECTURE))
    modules = _package_modules()
    assert modules - named == set(), f"modules missing from docs/ARCHITECTURE.md: {sorted(modules - named)}"
    assert named - modules == set(), f"docs/ARCHITECTURE.md names modules that do not exist: {sorted(named - modules)}"


def test_no_package_module_is_longer_than_400_lines() -> None:
    long = {m: n for m in _package_modules() if (n := len((PACKAGE / m).read_text().splitlines())) > 400}
    assert long == {}, f"split these modules (one concept each, at most 400 lines): {long}"


def test_the_core_stays_small() -> None:
    """At most 10 top-level modules (the rest lives in sub-packages by concept); the session adapters stay thin."""
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= 10, top
    assert len((PACKAGE / "session.py").read_text().splitlines()) <= 150


def test_the_projects_code_exclude_leaves_out_only_what_makes_no_number() -> None:
    """pyproject.toml's ``moeperf_code_exclude``: every path it names exists (a renamed module would silently become
    measured code again), and what summarises or plans a measurement (judging/stats.py, judging/levels.py, the
    kernels, the canary) is not in it."""
    import tomllib

    root = Path(__file__).parents[2]
    excluded = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"][
        "moeperf_code_exclude"].split()
    named = [p for p in excluded if "*" not in p]
    assert [p for p in named if not (root / p).exists()] == []
    for measured in ("pytest_moeperf/judging/stats.py", "pytest_moeperf/judging/levels.py", "pytest_moeperf/kernels",
                     "pytest_moeperf/machine/canary.py", "pytest_moeperf/store", "suites"):
        assert not any(measured == p or measured.startswith(p.rstrip("/") + "/") for p in named), measured
    assert "pytest_moeperf/judging/verdict.py" in named and "pytest_moeperf/judging/thresholds.py" in named
