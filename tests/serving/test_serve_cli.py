"""``moeperf serve``: bad input is refused before anything starts (the real start-and-stop is exercised by
``tests/attribution/test_attribute_real_server.py``, which serves through it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_moeperf.cli import main

PROFILES = str(Path(__file__).parents[2] / "suites" / "serving" / "profiles")


def test_unknown_profile_names_the_known_ones(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "no-such-profile", "--profiles", PROFILES]) == 2
    err = capsys.readouterr().err
    assert "no profile 'no-such-profile'; known:" in err and "cpu-tiny-nospec" in err


def test_emulation_is_refused_on_a_box_without_two_gpus(capsys: pytest.CaptureFixture[str]) -> None:
    # this machine (and CI) has no GPU: the same refusal the pytest option gives, before any server starts
    assert main(["serve", "cpu-tiny-nospec", "--profiles", PROFILES, "--interconnect-emulation", "pcie-no-p2p"]) == 2
    assert "needs at least 2 GPUs" in capsys.readouterr().err


def test_a_gpu_profile_on_a_box_without_gpus_says_what_it_needs(capsys: pytest.CaptureFixture[str],
                                                                tmp_path: Path) -> None:
    assert main(["serve", "gpu-tiny-tp2-nospec", "--profiles", PROFILES, "--model-cache", str(tmp_path),
                 "--log-dir", str(tmp_path)]) == 2
    assert "needs 2 GPU(s), this box has 0" in capsys.readouterr().err
