"""The two sides of ``moeperf ab``: each an environment to run the same pytest session in.

A side is an interpreter (``--base-python`` / ``--head-python``: a Python executable or a virtual environment's
directory; default: the interpreter running ``moeperf``), environment variables set on top of this one
(``--base-env`` / ``--head-env KEY=VALUE``, repeatable) and a checkout (``--base-ref`` / ``--head-ref REF``: that
git revision of the project, checked out in a temporary ``git worktree`` of its own and removed afterwards;
default: the checkout ``moeperf ab`` runs in, as it is, uncommitted changes included). A side's child sessions run
in the same directory relative to the checkout's top as ``moeperf ab`` was started in, so relative test paths
select the same tests on both sides. Two sides must differ in one of these (`Checkouts.same`): ``--aa`` is the run of
one side twice.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

BASE, HEAD = "base", "head"
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class SideError(ValueError):
    """A side cannot be set up (a revision that is not a commit, an interpreter that cannot run pytest); the
    message names the option."""


def parse_env(text: str) -> tuple[str, str]:
    """``KEY=VALUE`` (the value may be empty and may contain ``=``)."""
    key, sep, value = text.partition("=")
    if not sep or not _ENV_NAME.fullmatch(key):
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE with KEY a variable name, got {text!r}")
    return key, value


def parse_python(text: str) -> str:
    """An interpreter: an executable file, or a virtual environment's directory (its ``bin/python``)."""
    path = Path(text).expanduser()
    if path.is_dir():
        for candidate in (path / "bin" / "python", path / "Scripts" / "python.exe"):
            if candidate.is_file():
                return str(candidate.absolute())
        raise argparse.ArgumentTypeError(f"{text} is a directory without bin/python (not a virtual environment)")
    if not path.is_file():
        found = shutil.which(text)
        if found is None:
            raise argparse.ArgumentTypeError(f"{text}: no such interpreter")
        path = Path(found)
    if not os.access(path, os.X_OK):
        raise argparse.ArgumentTypeError(f"{text} is not executable")
    return str(path.absolute())


@dataclass(frozen=True)
class SideSpec:
    """A side as the command line describes it (``python`` None: this interpreter; ``ref`` None: this checkout)."""

    name: str
    python: str | None = None
    env: tuple[tuple[str, str], ...] = ()
    ref: str | None = None

    def option(self, what: str) -> str:
        return f"--{self.name}-{what}"


@dataclass(frozen=True)
class Side:
    """A side ready to run: the interpreter, the environment on top of this one, the directory to run in."""

    name: str
    python: str
    env: Mapping[str, str]
    cwd: Path
    ref: str | None = None
    commit: str | None = None  # the commit ``ref`` resolved to (None: this checkout, as it is)
    top: Path | None = None  # a revision's worktree: first on the children's PYTHONPATH
    plugin: str = ""  # the pytest_moeperf the side imports (its __init__.py)
    facts: dict[str, Any] = field(default_factory=dict)  # what its first child reported: versions, git

    def environ(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """This environment, the side's variables, ``extra``; a revision's worktree first on ``PYTHONPATH`` (its
        own packages, ``pytest_moeperf`` included, are imported, wherever in the worktree its sessions start)."""
        env = {**os.environ, **self.env, **(extra or {})}
        if self.top is not None:
            env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(self.top), env.get("PYTHONPATH"))))
        return env

    def describe(self) -> str:
        where = f"{self.ref} @ {self.commit[:10]}" if self.ref and self.commit else "this checkout"
        python = "this python" if self.python == sys.executable else self.python
        env = " ".join(f"{k}={v}" for k, v in sorted(self.env.items()))
        return f"{self.name}: {where}, {python}" + (f", {env}" if env else "")

    def provenance(self) -> dict[str, Any]:
        return {"python": self.python, "env": dict(self.env), "ref": self.ref, "commit": self.commit,
                "cwd": str(self.cwd), "pytest_moeperf": self.plugin, **self.facts}


def _git(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=120)


class Checkouts:
    """The sides' checkouts: this one, or a temporary ``git worktree`` per revision in ``root`` (the run's folder's
    `workdir.WORKTREES`), removed on leaving (also on Ctrl-C). Both sides at one commit share one worktree."""

    def __init__(self, cwd: Path, root: Path) -> None:
        self.cwd = cwd.resolve()
        self.top: Path | None = None
        self.root = root  # the directory of the worktrees
        self.trees: dict[str, Path] = {}  # commit -> worktree

    def __enter__(self) -> Checkouts:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
                 ) -> None:
        self.close()

    def _toplevel(self, spec: SideSpec) -> Path:
        if self.top is None:
            done = _git(self.cwd, "rev-parse", "--show-toplevel")
            if done.returncode != 0:
                raise SideError(f"{spec.option('ref')} {spec.ref}: {self.cwd} is not inside a git checkout")
            self.top = Path(done.stdout.strip()).resolve()
        return self.top

    def commit(self, spec: SideSpec) -> str:
        """The commit ``spec.ref`` names (`SideError` naming the option when it names none)."""
        assert spec.ref is not None
        top = self._toplevel(spec)
        done = _git(top, "rev-parse", "--verify", "--quiet", f"{spec.ref}^{{commit}}")
        if done.returncode != 0 or not done.stdout.strip():
            raise SideError(f"{spec.option('ref')} {spec.ref}: not a commit of the git checkout {top}")
        return done.stdout.strip()

    def checkout(self, spec: SideSpec, commit: str) -> Path:
        """The worktree of ``commit`` (made on first use)."""
        if commit in self.trees:
            return self.trees[commit]
        top = self._toplevel(spec)
        self.root.mkdir(exist_ok=True)
        path = self.root / f"{spec.name}-{commit[:12]}"
        done = _git(top, "worktree", "add", "--detach", "--quiet", str(path), commit)
        if done.returncode != 0:
            raise SideError(f"{spec.option('ref')} {spec.ref}: git worktree add failed: {done.stderr.strip()}")
        self.trees[commit] = path
        return path

    def _clean_commit(self) -> str | None:
        """This checkout's HEAD commit when nothing in it differs from that commit (no change to a tracked file, no
        untracked file git does not ignore); None when something does, or outside git."""
        head = _git(self.cwd, "rev-parse", "--verify", "--quiet", "HEAD^{commit}")
        status = _git(self.cwd, "status", "--porcelain", "--untracked-files=normal")
        if head.returncode or status.returncode or status.stdout.strip():
            return None
        return head.stdout.strip() or None

    def same(self, base: SideSpec, head: SideSpec) -> str | None:
        """What the two sides share when nothing differs between them (the same interpreter, the same environment
        on top of this one, checkouts of the same content), in words; None when something does (`SideError` for a
        ``ref`` that names no commit). ``--base-ref HEAD`` differs from this checkout only by its uncommitted
        changes."""
        python = {os.path.abspath(spec.python or sys.executable) for spec in (base, head)}
        if len(python) > 1 or env_difference({**os.environ, **dict(base.env)}, {**os.environ, **dict(head.env)}):
            return None
        env = " ".join(f"{k}={v}" for k, v in sorted(dict(base.env).items())) or "no variable set"
        refs = [spec for spec in (base, head) if spec.ref is not None]
        if not refs:
            return f"both: this checkout as it is, {python.pop()}, {env}"
        commits = {self.commit(spec) for spec in refs}
        commit = commits.pop()
        if commits:
            return None
        if len(refs) == 2:
            where = f"{base.option('ref')} {base.ref} and {head.option('ref')} {head.ref} are both commit {commit[:10]}"
        elif self._clean_commit() == commit:
            where = (f"{refs[0].option('ref')} {refs[0].ref} is commit {commit[:10]}, which this checkout is at with "
                     "no uncommitted change")
        else:
            return None
        return f"{where}; both: {python.pop()}, {env}"

    def prepare(self, spec: SideSpec) -> Side:
        """``spec`` ready to run: its checkout made, its interpreter checked to run pytest with moeperf there."""
        python = spec.python or sys.executable
        cwd, commit, tree = self.cwd, None, None
        if spec.ref is not None:
            commit = self.commit(spec)
            tree = self.checkout(spec, commit)
            cwd = tree / self.cwd.relative_to(self._toplevel(spec))
            cwd.mkdir(parents=True, exist_ok=True)  # an untracked directory the session was started in
        side = Side(spec.name, python, dict(spec.env), cwd, spec.ref, commit, tree)
        check = subprocess.run([python, "-c", "import pytest, pytest_moeperf.plugin as p; print(p.__file__)"],
                               cwd=cwd, env=side.environ(), capture_output=True, text=True, timeout=300)
        if check.returncode != 0:
            last = (check.stderr.strip().splitlines() or ["(no output)"])[-1]
            what = spec.option("python") + f" {python}" if spec.python else f"the {spec.name} side ({python})"
            raise SideError(f"{what} cannot import pytest and pytest_moeperf in {cwd}: {last}")
        plugin = (check.stdout.strip().splitlines() or [""])[-1]
        return dataclasses.replace(side, plugin=str(Path(plugin).parent) if plugin else "")

    def close(self) -> None:
        """Remove the worktrees made (``git worktree remove --force``, then the directory, then a prune)."""
        for path in self.trees.values():
            if self.top is not None:
                _git(self.top, "worktree", "remove", "--force", str(path))
        if self.root.exists():
            shutil.rmtree(self.root, ignore_errors=True)
            if self.top is not None:
                _git(self.top, "worktree", "prune")
        self.trees.clear()


def env_difference(base: Mapping[str, str], head: Mapping[str, str]) -> list[str]:
    """``KEY: base value -> head value`` for each variable the sides set differently (``-``: not set)."""
    return [f"{k}: {base.get(k, '-')} -> {head.get(k, '-')}" for k in sorted(set(base) | set(head))
            if base.get(k) != head.get(k)]


def version_difference(base: Mapping[str, Any], head: Mapping[str, Any]) -> list[str]:
    """``name: base version -> head version`` for each software version that differs."""
    return [f"{k}: {base.get(k, '-')} -> {head.get(k, '-')}" for k in sorted(set(base) | set(head))
            if base.get(k) != head.get(k)]


def facts_of(side: Side, document: Mapping[str, Any] | None) -> dict[str, Any]:
    """What a side's child report says about the side: python and software versions, the git commit (a revision's
    worktree is on no branch: the branch CI's variables name is the checkout's, not the side's)."""
    if not document:
        return {}
    machine = document.get("machine_info") or {}
    topology = (machine.get("moeperf") or {}).get("topology") or {}
    commit = document.get("commit_info") or {}
    git = {k: commit.get(k) for k in ("id", "dirty", "branch", "project")}
    if side.ref is not None:
        git["branch"] = None
    return {"python_version": machine.get("python_version"), "software": dict(topology.get("software") or {}),
            "git": git}

