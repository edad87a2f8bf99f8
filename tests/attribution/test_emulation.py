"""Interconnect emulation: the NCCL environment per name, where it is refused, and the baseline-key label."""

from __future__ import annotations

import dataclasses

import pytest

from pytest_moeperf.machine import emulation
from pytest_moeperf.machine.topology import Link, Topology, load_topology


@pytest.fixture
def h200x2() -> Topology:
    return load_topology("2x-h200-nvlink")


def _pcie_without_p2p(topo: Topology) -> Topology:
    return dataclasses.replace(topo, links=tuple(Link(k.a, k.b, "PHB", p2p=False) for k in topo.links))


def test_env_per_emulation() -> None:
    assert emulation.emulation_env("pcie-no-p2p") == {"NCCL_P2P_DISABLE": "1"}
    assert emulation.emulation_env("pcie-socket") == {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1"}
    env = emulation.emulation_env("pcie-no-p2p")
    env["X"] = "1"  # a copy: the table stays as it was
    assert emulation.emulation_env("pcie-no-p2p") == {"NCCL_P2P_DISABLE": "1"}


def test_unknown_name_is_an_error_that_lists_the_known_ones(h200x2: Topology) -> None:
    with pytest.raises(ValueError, match="known: pcie-no-p2p, pcie-socket"):
        emulation.emulation_env("nvlink-off")
    assert "unknown interconnect emulation 'nvlink-off'" in (emulation.check("nvlink-off", h200x2, {}) or "")


@pytest.mark.parametrize("name", ["pcie-no-p2p", "pcie-socket"])
def test_allowed_on_an_nvlink_pair_and_on_a_pcie_box_with_p2p(name: str, h200x2: Topology) -> None:
    assert emulation.check(name, h200x2, {}) is None
    assert emulation.check(name, load_topology("8x-rtx-pro-6000-pcie"), {}) is None


@pytest.mark.parametrize("name", ["pcie-no-p2p", "pcie-socket"])
def test_refused_with_fewer_than_two_gpus(name: str, h200x2: Topology) -> None:
    one = dataclasses.replace(h200x2, gpus=h200x2.gpus[:1], links=())
    reason = emulation.check(name, one, {})
    assert reason is not None and "at least 2 GPUs" in reason


def test_no_p2p_refused_where_there_is_no_p2p_to_take_away_but_socket_is_not(h200x2: Topology) -> None:
    pcie = _pcie_without_p2p(h200x2)
    reason = emulation.check("pcie-no-p2p", pcie, {})
    assert reason is not None and "would change nothing" in reason
    assert emulation.check("pcie-socket", pcie, {}) is None


def test_refused_when_the_environment_already_says_otherwise(h200x2: Topology) -> None:
    reason = emulation.check("pcie-socket", h200x2, {"NCCL_SHM_DISABLE": "0"})
    assert reason is not None and "NCCL_SHM_DISABLE=0" in reason
    assert emulation.check("pcie-socket", h200x2, {"NCCL_P2P_DISABLE": "1"}) is None  # same value: no clash


def test_label_keys_baselines_apart(h200x2: Topology) -> None:
    slug = h200x2.fingerprint.slug
    assert emulation.label(None) == emulation.label("none") == ""
    assert emulation.label("pcie-no-p2p") == "+pcie-no-p2p"
    assert emulation.keyed_slug(slug, "pcie-socket") == f"{slug}+pcie-socket"
    assert emulation.keyed_slug(slug, None) == slug
    keys = {emulation.keyed_slug(slug, n) for n in (None, *emulation.names())}
    assert len(keys) == 3


# ----------------------------------------------------------------------------------------- the option, end to end
_SEES_ENV = """
import os

def test_env(topology):
    assert os.environ.get("NCCL_P2P_DISABLE") == "1"
    assert topology.emulation == "pcie-no-p2p"
    assert topology.fingerprint.slug == "2x-h200-nvlink+pcie-no-p2p"
"""


def test_option_sets_the_nccl_environment_labels_the_key_and_restores(  # type: ignore[no-untyped-def]
        pytester: pytest.Pytester, run_moeperf, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NCCL_P2P_DISABLE", raising=False)
    pytester.makepyfile(test_emu=_SEES_ENV)
    result = run_moeperf("--moeperf-topology", "2x-h200-nvlink", "--moeperf-interconnect-emulation", "pcie-no-p2p")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["moeperf: 2x-h200-nvlink+pcie-no-p2p (hash *under emulation pcie-no-p2p*"])
    assert "NCCL_P2P_DISABLE" not in __import__("os").environ  # put back when the session ended


def test_emulation_changes_the_fingerprint_hash_too(h200x2: Topology) -> None:
    labelled = dataclasses.replace(h200x2, emulation="pcie-socket")
    assert labelled.fingerprint.slug == "2x-h200-nvlink+pcie-socket"
    assert labelled.fingerprint.hash != h200x2.fingerprint.hash
    assert "emulation" not in labelled.to_json()  # a property of the session, not of the box's file


@pytest.mark.parametrize(("topology_name", "name", "message"), [
    ("cpu", "pcie-no-p2p", "*--moeperf-interconnect-emulation: *needs at least 2 GPUs*"),
    ("2x-h200-nvlink", "nvlink-off", "*unknown interconnect emulation 'nvlink-off'; known: pcie-no-p2p, pcie-socket*"),
])
def test_refused_emulation_is_a_usage_error(pytester: pytest.Pytester, run_moeperf, topology_name: str,  # type: ignore[no-untyped-def]
                                            name: str, message: str) -> None:
    topo = topology_name
    if topology_name == "cpu":
        path = pytester.path / "cpu.json"
        path.write_text('{"schema": 1, "gpus": [], "links": [], "host": {"cpu_model": "Test CPU", "arch": "x86_64",'
                        ' "cores": 2, "memory_bytes": 25769803776}}')
        topo = str(path)
    pytester.makepyfile("def test_t():\n    pass\n")
    result = run_moeperf("--moeperf-topology", topo, "--moeperf-interconnect-emulation", name)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])
