"""The README's tables name every option, ini key, marker and hook the code has (and nothing it lacks)."""

from __future__ import annotations

import re
from pathlib import Path

from pytest_moeperf import hookspec
from pytest_moeperf.plugin import MARKERS
from pytest_moeperf.settings import OPTIONS

README = (Path(__file__).parents[2] / "README.md").read_text()


def test_every_option_and_its_ini_twin_is_documented() -> None:
    for option in OPTIONS:
        assert f"`{option.flag}" in README, option.flag
        assert f"`{option.ini}`" in README, option.ini
    documented = set(re.findall(r"`(--moeperf-[a-z-]+)", README))
    assert documented <= {o.flag for o in OPTIONS}, documented - {o.flag for o in OPTIONS}


def test_every_marker_is_documented() -> None:
    for marker in MARKERS:
        name = marker.split("(")[0].split(":")[0]
        assert f"`{name}" in README, name


def test_every_hook_is_documented() -> None:
    hooks = [name for name in dir(hookspec) if name.startswith("pytest_moeperf_")]
    assert hooks
    for name in hooks:
        assert f"`{name}(" in README, name
