"""Attach mode: profiles synthesised from running servers (``--moeperf-server-url [NAME=]URL``, repeatable).

Each URL's server is asked what it serves (``GET /v1/models``: the model id and its ``max_model_len``) and whether
it speculates (``GET /metrics``: vLLM's spec-decode counters exist only then). The profile is named after the
served model (``NAME-<model>`` when the URL was named), so test ids and baselines are keyed by what was measured.
``reference=URL`` and ``candidate=URL`` pair two servers: the candidate's speedup is measured against the
reference. Where the server runs is unknown: a loopback URL on a host without GPUs is taken as a CPU server (the
CPU workload), anything else as a GPU server.

The server's processes are this session's own load, not foreign load: `listening_pids` finds them from the URL's
port (for a server on this host), and the serving wing hands them to the health gate as roots of "our" process
tree (with those named by ``--moeperf-server-pid``), so the gate trips only on truly foreign CPU and GPU work.
"""

from __future__ import annotations

import json
import time
from typing import Any
from urllib.parse import urlparse

from pytest_moeperf.serving.analysis.prometheus import parse
from pytest_moeperf.serving.analysis.specdecode import DRAFTS
from pytest_moeperf.serving.lifecycle.server import http_get
from pytest_moeperf.serving.models.profiles import ServeProfile

__all__ = ["AttachError", "attached_profiles", "listening_pids", "split_url"]

REFERENCE, CANDIDATE = "reference", "candidate"
LOOPBACK = {"127.0.0.1", "localhost", "::1"}


class AttachError(RuntimeError):
    """A server given with ``--moeperf-server-url`` cannot be measured; the message names the URL."""


def split_url(entry: str) -> tuple[str | None, str]:
    """``NAME=URL`` or ``URL`` into (name or None, URL)."""
    head, sep, tail = entry.partition("=")
    if sep and "://" not in head:
        return head, tail
    return None, entry


def attached_profiles(entries: tuple[str, ...], *, local_gpus: int, wait_s: float = 60.0) -> dict[str, ServeProfile]:
    """One synthesised profile per URL; the candidate of a ``reference=``/``candidate=`` pair names the reference."""
    profiles: dict[str, ServeProfile] = {}
    roles: dict[str, str] = {}
    for entry in entries:
        name, url = split_url(entry)
        profile = synthesise(url, name, local_gpus=local_gpus, wait_s=wait_s)
        if profile.name in profiles:
            raise AttachError(f"{url} and {profiles[profile.name].attached_url} both yield profile {profile.name!r}")
        profiles[profile.name] = profile
        if name in (REFERENCE, CANDIDATE):
            roles[name] = profile.name
    if CANDIDATE in roles:
        if REFERENCE not in roles:
            raise AttachError("--moeperf-server-url candidate=URL needs a reference=URL to measure the speedup against")
        cand = profiles[roles[CANDIDATE]]
        profiles[cand.name] = _with_reference(cand, roles[REFERENCE])
    return profiles


def synthesise(url: str, name: str | None, *, local_gpus: int, wait_s: float) -> ServeProfile:
    base = url.rstrip("/")
    deadline = time.monotonic() + wait_s
    while True:
        status, body = http_get(base + "/v1/models", timeout_s=5.0)
        if status == 200 or time.monotonic() > deadline:
            break
        time.sleep(2.0)
    if status != 200:
        raise AttachError(f"--moeperf-server-url {url}: GET /v1/models answered {status or 'nothing'}: {body[:300]}")
    try:
        cards = [c for c in json.loads(body).get("data", []) if isinstance(c, dict) and c.get("id")]
    except (ValueError, AttributeError):
        cards = []
    if not cards:
        raise AttachError(f"--moeperf-server-url {url}: /v1/models lists no model: {body[:300]}")
    card = cards[0]  # the served model (LoRA adapters, if any, follow it)
    model = str(card["id"])
    status, metrics = http_get(base + "/metrics", timeout_s=10.0)
    speculating = status == 200 and bool(parse(metrics).select(DRAFTS))
    host = urlparse(base).hostname or ""
    device = "cpu" if host in LOOPBACK and local_gpus == 0 else "cuda"
    max_len = card.get("max_model_len")
    return ServeProfile(
        name=f"{name}-{model}" if name else model,
        model=model,
        device=device,
        max_model_len=int(max_len) if isinstance(max_len, int) else 1 << 30,
        speculative={"method": "unknown (attached)"} if speculating else None,
        description=f"attached: {model} at {base}" + (" (speculative decoding on)" if speculating else ""),
        attached_url=base,
    )


def _with_reference(profile: ServeProfile, reference: str) -> ServeProfile:
    from dataclasses import replace

    return replace(profile, reference=reference)


def listening_pids(url: str) -> tuple[tuple[int, ...], str]:
    """The processes on this host that listen on ``url``'s port (an attached server's API server; with several API
    server processes, each that holds the socket), and a note on how they were found (or why none was).

    ``psutil.net_connections`` first (on Linux it reads every socket but names only the processes this user may
    inspect); then each process's own connections, skipping those it may not read. A server of another user, or
    one in another PID namespace (a container), stays unnamed without root: ``--moeperf-server-pid`` names it."""
    parsed = urlparse(url)
    host = parsed.hostname or ""
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    if not _local(host):
        return (), f"{host} is not this host: its processes are not ours to watch"
    import psutil  # optional: the health gate's dependency

    def listening(conn: Any) -> bool:
        return bool(conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port)

    found: set[int] = set()
    try:
        for conn in psutil.net_connections(kind="inet"):
            if listening(conn) and conn.pid:
                found.add(conn.pid)
    except (psutil.AccessDenied, OSError):
        pass
    if not found:
        for proc in psutil.process_iter():
            try:
                if any(listening(c) for c in proc.net_connections(kind="inet")):
                    found.add(proc.pid)
            except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess, OSError):
                continue
    if not found:
        return (), (f"no process of this user listens on port {port} (another user's server, or a container?): "
                    "name its pid with --moeperf-server-pid")
    return tuple(sorted(found)), f"listening on port {port}"


def _local(host: str) -> bool:
    """Whether ``host`` is this machine: a loopback name or one of its interfaces' addresses."""
    if host in LOOPBACK or host.startswith("127.") or host in ("0.0.0.0", "::"):
        return True
    import socket

    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(host, None)}
    except OSError:
        return False
    import psutil

    mine = {a.address.split("%")[0] for addrs in psutil.net_if_addrs().values() for a in addrs}
    return bool(addresses & mine)
