"""Interconnect emulation: take NVLink (and host shared memory) away from NCCL, as a labelled stand-in for a PCIe
box without peer-to-peer.

An emulation is nothing but NCCL environment variables, set for the all-reduce suite's ranks and for launched
vLLM servers. Measured with nccl-tests on 2×H200 (14,336 B, CUDA graph / eager): NVLink 7.5 / 16.9 µs,
``pcie-no-p2p`` 13.1 / 21.7 µs, ``pcie-socket`` 63.7 / 64.7 µs (issue 12). Results measured under an emulation
are not the box's own: :func:`label` goes into the baseline key (the fingerprint slug gets a ``+<name>``
suffix) so they never mix with native baselines, and :func:`check` refuses an emulation where it makes no sense.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass

from pytest_moeperf.machine.topology import Topology

__all__ = ["EMULATIONS", "Emulation", "apply", "check", "emulation_env", "get", "keyed_slug", "label", "names"]


@dataclass(frozen=True)
class Emulation:
    name: str
    env: Mapping[str, str]
    description: str


EMULATIONS: dict[str, Emulation] = {
    e.name: e
    for e in (
        Emulation("pcie-no-p2p", {"NCCL_P2P_DISABLE": "1"},
                  "NCCL without peer-to-peer (no NVLink, no PCIe P2P): all-reduce through host shared memory"),
        Emulation("pcie-socket", {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1"},
                  "NCCL without peer-to-peer and shared memory: all-reduce through sockets on the host"),
    )
}


def names() -> list[str]:
    return sorted(EMULATIONS)


def get(name: str) -> Emulation:
    try:
        return EMULATIONS[name]
    except KeyError:
        raise ValueError(f"unknown interconnect emulation {name!r}; known: {', '.join(names())}") from None


def emulation_env(name: str) -> dict[str, str]:
    """The environment variables that make NCCL behave as emulation ``name`` does."""
    return dict(get(name).env)


def _has_p2p(topology: Topology) -> bool:
    return any(link.kind == "NVLINK" or link.p2p for link in topology.links)


def check(name: str, topology: Topology, environ: Mapping[str, str] | None = None) -> str | None:
    """Why emulation ``name`` is refused on ``topology`` (None: allowed).

    Refused: an unknown name; fewer than 2 GPUs (no all-reduce to slow down); ``pcie-no-p2p`` on a box whose
    GPUs have no peer-to-peer path already (the emulation would change nothing, and its label would call the
    real thing a stand-in); an environment that already sets one of the variables to another value.
    """
    if name not in EMULATIONS:
        return f"unknown interconnect emulation {name!r}; known: {', '.join(names())}"
    if topology.gpu_count < 2:
        return f"interconnect emulation {name!r} needs at least 2 GPUs, this topology has {topology.gpu_count}"
    if name == "pcie-no-p2p" and not _has_p2p(topology):
        return (f"interconnect emulation {name!r} would change nothing: the {topology.gpu_count} GPUs already have "
                "no peer-to-peer path (PCIe without P2P); measure natively instead")
    env = os.environ if environ is None else environ
    clashes = [f"{k}={env[k]}" for k, v in EMULATIONS[name].env.items() if k in env and env[k] != v]
    if clashes:
        return f"interconnect emulation {name!r} clashes with the environment ({', '.join(clashes)})"
    return None


def label(name: str | None) -> str:
    """The suffix an emulation adds to the fingerprint slug that keys baselines: ``+pcie-no-p2p``; ``""``
    for none."""
    if name is None or name in ("", "none"):
        return ""
    return "+" + get(name).name


def keyed_slug(slug: str, name: str | None) -> str:
    """``2x-h200-nvlink`` → ``2x-h200-nvlink+pcie-no-p2p`` under that emulation."""
    return slug + label(name)


def apply(name: str | None, topology: Topology,
          environ: MutableMapping[str, str] | None = None) -> tuple[Topology, Callable[[], None]]:
    """Run this process (and every process it starts: all-reduce ranks, vLLM servers) under emulation ``name``.

    Returns the topology labelled with the emulation (its fingerprint slug and hash change, so baselines are
    keyed apart) and a function that puts the environment back. ``None``: nothing changes. Raises
    ``ValueError`` with :func:`check`'s reason where the emulation is refused.
    """
    env = os.environ if environ is None else environ
    if name is None:
        return topology, lambda: None
    reason = check(name, topology, env)
    if reason is not None:
        raise ValueError(reason)
    saved = {k: env.get(k) for k in EMULATIONS[name].env}
    env.update(EMULATIONS[name].env)

    def restore() -> None:
        for key, value in saved.items():
            if value is None:
                env.pop(key, None)
            else:
                env[key] = value

    return dataclasses.replace(topology, emulation=name), restore
