"""Loopback ports of launched servers: a free one, and whether it is *our* server that listens on it.

A free port is found by binding port 0 and closing the socket; the server binds it seconds later (vLLM's imports
come first). In between another process can take it: the server then exits with "Address already in use"
(:data:`ADDRESS_IN_USE`, which the launcher recognises in its log to start again on a fresh port), and until it
does, the other listener answers ``/health``. :func:`session_listens` tells them apart: the kernel's table of
listening sockets (``/proc/net/tcp``, ``tcp6``) against the sockets the server's process session holds open.
"""

from __future__ import annotations

import errno
import os
import socket
from pathlib import Path

from pytest_moeperf.processes.lifecycle import leftover_processes

__all__ = ["ADDRESS_IN_USE", "free_port", "listening_inodes", "session_listens"]

#: What a server that lost its port writes before it exits (``OSError: [Errno 98] Address already in use``).
ADDRESS_IN_USE = os.strerror(errno.EADDRINUSE)
_LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's state column


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now (it may be taken before it is used: see the module's note)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def listening_inodes(port: int, proc_net: Path = Path("/proc/net")) -> set[int] | None:
    """The socket inodes listening on TCP ``port`` (any address, IPv4 and IPv6); None where the kernel's tables
    cannot be read (not Linux)."""
    found: set[int] = set()
    readable = False
    for table in ("tcp", "tcp6"):
        try:
            lines = (proc_net / table).read_text().splitlines()[1:]
        except OSError:
            continue
        readable = True
        for line in lines:
            fields = line.split()
            # sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
            if len(fields) > 9 and fields[3] == _LISTEN and int(fields[1].rsplit(":", 1)[1], 16) == port:
                found.add(int(fields[9]))
    return found if readable else None


def _socket_inodes(pid: int) -> set[int]:
    inodes: set[int] = set()
    fd_dir = Path(f"/proc/{pid}/fd")
    try:
        names = os.listdir(fd_dir)
    except OSError:
        return inodes
    for name in names:
        try:
            target = os.readlink(fd_dir / name)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[len("socket:["):-1]))
    return inodes


def session_listens(session_pid: int, port: int) -> bool | None:
    """Whether a process of the session led by ``session_pid`` holds the socket listening on ``port``; None when
    this cannot be told (no ``/proc``)."""
    listening = listening_inodes(port)
    if listening is None:
        return None
    if not listening:
        return False
    return any(_socket_inodes(pid) & listening for pid, _ in leftover_processes([session_pid]))
