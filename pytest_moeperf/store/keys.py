"""Metric keys that do not move with the command line.

pytest's node ids are relative to its rootdir, and with no configuration file its rootdir is the common ancestor of
the command line's existing paths, among which it counts an option's value spelled with a space
(``--moeperf-baselines ../bl``): every node id then changes. A metric's key (``<test id>::<name>``) therefore starts
with the test file's path relative to the file's *project root*, found from the file's own location:

1. the nearest directory at or above it that holds a pytest configuration file (``pytest.toml``, ``pytest.ini``,
   their dot-names, ``pyproject.toml`` with a ``[tool.pytest…]`` table, ``tox.ini`` with ``[pytest]``, ``setup.cfg``
   with ``[tool:pytest]``), else the nearest holding a ``pyproject.toml`` (pytest's own rule for its rootdir),
2. else the nearest holding ``setup.py``,
3. else the top of the git work tree (the nearest holding ``.git``),
4. else the directory pytest was started in when the file lies under it (pytest's rootdir then), else the file's
   own directory.

So a project with a configuration file keeps the keys pytest gives it, however its command line is spelled, and so
do a ``--moeperf-rounds`` child, a ``moeperf ab`` side in a worktree of another revision and an xdist worker.
"""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path
from typing import Protocol

#: the attribute of a test report that carries its test id: it travels with the report from an xdist worker, which
#: has the item, to the controller, which has only the node id
REPORT_ATTRIBUTE = "moeperf_test_id"
_ALWAYS = ("pytest.toml", ".pytest.toml", "pytest.ini", ".pytest.ini")
_SECTIONS = {"tox.ini": re.compile(r"^\[pytest\]", re.M), "setup.cfg": re.compile(r"^\[tool:pytest\]", re.M)}


class _Item(Protocol):
    @property
    def path(self) -> Path: ...

    @property
    def nodeid(self) -> str: ...


def _holds_pytest_config(directory: Path) -> bool:
    if any((directory / name).is_file() for name in _ALWAYS):
        return True
    pyproject = directory / "pyproject.toml"
    if pyproject.is_file():
        try:
            tool = tomllib.loads(pyproject.read_text(encoding="utf-8")).get("tool", {})
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
            tool = {}
        if isinstance(tool, dict) and "pytest" in tool:
            return True
    for name, section in _SECTIONS.items():
        try:
            if section.search((directory / name).read_text(encoding="utf-8", errors="replace")):
                return True
        except OSError:
            continue
    return False


def project_root(directory: Path, invocation_dir: Path) -> Path:
    """The project root of the files in ``directory`` (absolute); see the module docstring for the rule."""
    directory = Path(os.path.abspath(directory))
    ancestors = (directory, *directory.parents)
    for marks in (_holds_pytest_config, lambda d: (d / "pyproject.toml").is_file(),
                  lambda d: (d / "setup.py").is_file(), lambda d: (d / ".git").exists()):
        found = next((d for d in ancestors if marks(d)), None)
        if found is not None:
            return found
    invocation_dir = Path(os.path.abspath(invocation_dir))
    return invocation_dir if invocation_dir in ancestors else directory


class TestIds:
    """pytest's node ids as the test ids of metric keys, for one session (each directory's root looked up once)."""

    __test__ = False  # not a test class, whatever pytest collects

    def __init__(self, rootpath: Path, invocation_dir: Path) -> None:
        self.rootpath = Path(rootpath)
        self.invocation_dir = Path(invocation_dir)
        self._roots: dict[Path, Path] = {}

    def of_path(self, path: Path, nodeid: str) -> str:
        """The test id of node ``nodeid`` of the test file ``path``."""
        directory = Path(os.path.abspath(path)).parent
        if directory not in self._roots:
            self._roots[directory] = project_root(directory, self.invocation_dir)
        relative = Path(os.path.abspath(path)).relative_to(self._roots[directory]).as_posix()
        _, sep, rest = nodeid.partition("::")
        return f"{relative}{sep}{rest}"

    def of_item(self, item: _Item) -> str:
        return self.of_path(item.path, item.nodeid)

    def of_nodeid(self, nodeid: str) -> str:
        """The test id of a node id whose file part is relative to the rootdir (a report without its item); a node
        id without one is kept as it is."""
        file_part = nodeid.partition("::")[0]
        if not file_part:
            return nodeid
        return self.of_path(self.rootpath / file_part, nodeid)
