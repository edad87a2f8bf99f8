"""The project's configuration file and rootdir as the command line meant them, however an option's value is spelled.

pytest finds its rootdir and configuration file (`_pytest.config.findpaths.determine_setup`) before it loads the
plugins of its ``pytest11`` entry points, ours included. At that moment ``--moeperf-markdown`` is an option it does
not know, so the value after it (``--moeperf-markdown ../runner/step_summary``) reads as a positional argument: a
test path. An existing one counts towards the rootdir, and the configuration file is looked for above the common
ancestor of those paths: with ``$GITHUB_STEP_SUMMARY`` (a file outside the checkout) pytest reads no configuration
file at all, and the ini settings (``moeperf_strict``, the baselines directory, which is relative to the ini file)
are lost. ``--moeperf-markdown=PATH`` is one argument and does not move anything.

Once the plugins are loaded (`pytest_load_initial_conftests`, our first hook after that), the same command line is
parsed again with every option known and pytest's own rule applied to what is left: the *meant* rootdir and
configuration file. When they differ from pytest's, the `moeperf_*` settings are read from the meant file (so the
verdicts are the same whichever way the option was written) and the session says what pytest itself did not read
(`problem`): a warning, which ``--moeperf-strict`` fails, when the configuration file differs; a note when only the
rootdir moved (node ids and pytest's cache follow it; metric keys do not, `store.keys`).
"""

from __future__ import annotations

import inspect
import os
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

PREFIX = "--moeperf-"
_TRUE, _FALSE = {"y", "yes", "t", "true", "on", "1"}, {"n", "no", "f", "false", "off", "0"}  # pytest's own words


@dataclass(frozen=True)
class Setup:
    """pytest's rootdir and configuration file as meant, beside the ones it used (``was_*``)."""

    rootpath: Path
    inipath: Path | None
    was_rootpath: Path
    was_inipath: Path | None
    values: Mapping[str, object] = field(default_factory=dict)  # the meant file's settings, raw
    taken: tuple[str, ...] = ()  # "--moeperf-x VALUE" written with a space, VALUE an existing path

    @property
    def lost_configuration(self) -> bool:
        return self.inipath != self.was_inipath


setup_key = pytest.StashKey[Setup]()


def _determine(ns: Any, invocation_dir: Path) -> tuple[Path, Path | None, Mapping[str, object]] | None:
    """pytest's own rule (`determine_setup`) on a parsed command line; None where this pytest's rule cannot be
    called (its signature changed): then nothing is corrected."""
    from _pytest.config import findpaths

    determine: Any = findpaths.determine_setup
    given = {"inifile": ns.inifilename, "override_ini": getattr(ns, "override_ini", None),
             "args": list(getattr(ns, "file_or_dir", None) or ()), "rootdir_cmd_arg": ns.rootdir or None,
             "invocation_dir": invocation_dir}
    try:
        accepted = inspect.signature(determine).parameters
        found = determine(**{name: value for name, value in given.items() if name in accepted})
        return Path(found[0]), (Path(found[1]) if found[1] is not None else None), dict(found[2])
    except (TypeError, ValueError, OSError, IndexError, pytest.UsageError):
        return None


def _taken(args: Sequence[str], invocation_dir: Path) -> tuple[str, ...]:
    """Our options written with a space before a value that names an existing path."""
    return tuple(f"{arg} {value}" for arg, value in zip(args, args[1:], strict=False)
                 if arg.startswith(PREFIX) and "=" not in arg and not value.startswith("-")
                 and os.path.lexists(invocation_dir / value))


def detect(config: pytest.Config, parser: pytest.Parser) -> None:
    """Parse the command line pytest started from again, now that every option is known; stash the meant setup
    when it differs from pytest's (`setup_key`)."""
    env = os.environ.get("PYTEST_ADDOPTS", "")
    try:
        args = [*shlex.split(env), *config.invocation_params.args]
        ns = parser.parse_known_args(args)
    except (ValueError, pytest.UsageError, SystemExit):
        return  # pytest's own parse says what is wrong with it, later
    invocation_dir = Path(config.invocation_params.dir)
    meant = _determine(ns, invocation_dir)
    if meant is None or (meant[0], meant[1]) == (config.rootpath, config.inipath):
        return
    config.stash[setup_key] = Setup(rootpath=meant[0], inipath=meant[1], was_rootpath=config.rootpath,
                                    was_inipath=config.inipath, values=meant[2],
                                    taken=_taken(args, invocation_dir))


def ini_dir(config: pytest.Config) -> Path:
    """The directory paths in the configuration file (and defaults) are relative to: the meant file's, else the
    meant rootdir."""
    setup = config.stash.get(setup_key, None)
    inipath, rootpath = (setup.inipath, setup.rootpath) if setup else (config.inipath, config.rootpath)
    return Path(inipath).parent if inipath else Path(rootpath)


def rootpath(config: pytest.Config) -> Path:
    """The meant rootdir (where provenance looks for the git checkout)."""
    setup = config.stash.get(setup_key, None)
    return setup.rootpath if setup else Path(config.rootpath)


def ini_value(config: pytest.Config, name: str, flag: bool) -> object:
    """The configuration file's value of ``name`` as `pytest.Config.getini` gives it (a bool for a ``flag``, else a
    string; None: not set), read from the meant file when pytest read another one."""
    setup = config.stash.get(setup_key, None)
    if setup is None or not setup.lost_configuration:
        return config.getini(name)
    raw = setup.values.get(name)
    raw = getattr(raw, "value", raw)  # pytest 9 wraps each value with its origin
    if raw is None:
        return None  # the option's default
    if isinstance(raw, list):
        raw = "\n".join(str(item) for item in raw)
    if not flag or isinstance(raw, bool):
        return raw if isinstance(raw, bool) else str(raw)
    word = str(raw).strip().lower()
    if word not in _TRUE | _FALSE:
        raise pytest.UsageError(f"{setup.inipath}: {name} = {raw!r}: expected true or false")
    return word in _TRUE


def problem(config: pytest.Config) -> tuple[str, bool] | None:
    """What the session must say when pytest's rootdir or configuration file is not the meant one, and whether it is
    a warning (``--moeperf-strict`` fails it): pytest applied another configuration file, or the meant one holds
    settings of pytest's own (``testpaths``, ``markers``, ``addopts``, …) that only pytest reads. Otherwise (only
    the rootdir moved, or the file holds nothing but ``moeperf_*`` settings, which are read from it) a note."""
    setup = config.stash.get(setup_key, None)
    if setup is None:
        return None
    why = (f"pytest took {' and '.join(repr(t) for t in setup.taken)} for a test path" if setup.taken
           else "an option's value written with a space was taken by pytest for a test path")
    fix = "; write an option and its value as one argument (--moeperf-markdown=PATH)"
    moved = (f"its rootdir is {setup.was_rootpath}, not {setup.rootpath} (node ids and pytest's cache follow it, "
             "metric keys do not)")
    if not setup.lost_configuration:
        return f"{why}: {moved}{fix}", False
    own = sorted(name for name in setup.values if not name.startswith("moeperf_"))
    read = f"read {setup.was_inipath}" if setup.was_inipath else "read no configuration file"
    text = (f"{why}: it {read} instead of {setup.inipath or 'none'}; the moeperf_* settings were read from "
            f"{setup.inipath or 'no file'}")
    if own:
        text += f", but pytest's own there ({', '.join(own)}) were not applied"
    return f"{text}; {moved}{fix}", bool(own) or setup.was_inipath is not None
