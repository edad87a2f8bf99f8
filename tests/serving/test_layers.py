"""The serving wing's parts import one way only: models <- analysis <- load <- lifecycle <- the wiring in `serving/`.

Every import of every module under ``pytest_moeperf/serving/`` is read from its source (``ast``: module level,
function-local and ``TYPE_CHECKING`` ones alike, relative ones resolved) and its part compared with the importer's.
"""

from __future__ import annotations

import ast
from pathlib import Path

SERVING = Path(__file__).parents[2] / "pytest_moeperf" / "serving"
PREFIX = "pytest_moeperf.serving"
ORDER = ("models", "analysis", "load", "lifecycle")  # lowest first; the wiring in serving/ itself sits above them
WIRING = len(ORDER)


def layer_of(module: str) -> int:
    """The rank of a dotted ``pytest_moeperf.serving…`` module: its part's index, or `WIRING` for the package's own
    top-level modules (and the package itself)."""
    rest = module.removeprefix(PREFIX).lstrip(".").split(".")
    return ORDER.index(rest[0]) if rest[0] in ORDER else WIRING


def module_name(path: Path, root: Path) -> str:
    """The dotted name of ``path``, a file under ``root`` (the folder that is ``pytest_moeperf.serving``)."""
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join((PREFIX, *(parts[:-1] if parts[-1] == "__init__" else parts)))


def imported(path: Path, root: Path) -> list[tuple[int, str]]:
    """Every module ``path`` imports (``from X import y`` counts as X and as X.y: y may be a submodule), with its
    line."""
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            found.append((node.lineno, source))
            found += [(node.lineno, f"{source}.{alias.name}") for alias in node.names]
    return found


def upward_imports(root: Path) -> list[str]:
    """``file:line importer -> imported`` for each import statement of a higher part by a lower one under ``root``."""
    bad: dict[str, str] = {}
    for path in sorted(root.rglob("*.py")):
        name = module_name(path, root)
        for line, target in imported(path, root):
            if target.startswith(PREFIX + ".") and layer_of(target) > layer_of(name):
                bad.setdefault(f"{path.relative_to(root.parent)}:{line}", f"{name} -> {target}")
    return [f"{where} {what}" for where, what in bad.items()]


def test_every_module_lies_in_a_part_or_is_wiring() -> None:
    subpackages = {p.name for p in SERVING.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert subpackages == set(ORDER), subpackages
    assert all((SERVING / part / "__init__.py").exists() for part in ORDER)


def test_no_part_imports_a_part_above_it() -> None:
    assert upward_imports(SERVING) == []


def test_the_check_sees_local_relative_and_type_checking_imports(tmp_path: Path) -> None:
    """A copy of the wing with three upward imports planted (one function-local, one relative, one under
    ``TYPE_CHECKING``) and one downward import is reported on exactly the three."""
    root = tmp_path / "pytest_moeperf" / "serving"
    for part in ORDER:
        (root / part).mkdir(parents=True)
        (root / part / "__init__.py").write_text("")
    (root / "__init__.py").write_text("")
    (root / "plugin.py").write_text("from pytest_moeperf.serving.models import profiles\n")
    (root / "models" / "profiles.py").write_text("def f():\n    from pytest_moeperf.serving.lifecycle import pool\n")
    (root / "analysis" / "metrics.py").write_text("from ..load.loadgen import Request\n")
    (root / "load" / "loadgen.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pytest_moeperf.serving import recording\n")
    bad = upward_imports(root)
    assert [b.split()[0] for b in bad] == ["serving/analysis/metrics.py:1", "serving/load/loadgen.py:3",
                                           "serving/models/profiles.py:2"], bad
