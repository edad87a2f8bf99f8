"""Kernel compiles the server logged while it served: a window that met them measured the compiler, not the server.

Seen on 1x H200 (vLLM 0.26, tiny MoE): c=16 and c=64 windows read 19-30 % apart between two server starts, and one
window's TPOT went 2.54 -> 1.79 ms from its first to its last quarter, while c=1 windows agreed within 3 %. Triton
compiles a kernel the first time it meets a new batch shape (the fused MoE kernel's configuration depends on the
number of tokens), and closed loops at high concurrency keep meeting new mixes of prefills and decodes long after a
few warm-up requests.

vLLM logs each such event after its own start-up warm-up (``vllm.utils.jit_monitor``, vLLM 0.2x): a warning
``"<backend> <event> during inference: <kernel> …"``: once per kernel by default, once per compile with
``--jit-monitor-verbose`` (the GPU profiles pass it). `Served.measure` marks the server's log before a pass, reads
what was appended after it, repeats the warm pass of a shape while it still compiled (up to `MAX_WARM_PASSES`), runs
a window that compiled once more (`MAX_WINDOW_REPEATS`: the first run counts as a warm pass; a warm pass of a few
requests does not meet every mix of prefills and decodes that the window's hundreds do), and a window during which
the server still compiled is INCONCLUSIVE for its timed metrics, with the kernels named.
Only a server this session launched has a log here; an attached one is not checked (said in the context).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["MAX_WARM_PASSES", "MAX_WINDOW_REPEATS", "Compiles", "LogMark", "compiles_since", "mark"]

#: warm passes of one shape at most while each still made the server compile
MAX_WARM_PASSES = 3
#: times a window that made the server compile is run again (it served as one more warm pass): on 1x H200 with a cold
#: Triton cache the c=16 and c=64 windows still compiled fused_moe_kernel after quiet warm passes, and were set aside
MAX_WINDOW_REPEATS = 1

#: vLLM's jit_monitor message: "Triton kernel JIT compilation during inference: fused_moe_kernel (...). This causes…"
_EVENT = re.compile(r"(?P<what>[A-Za-z][\w -]*?) during inference: (?P<kernel>[\w.<>-]+)")


@dataclass(frozen=True)
class LogMark:
    """Where a server's log ended at some moment (``path`` None: no log to read, e.g. an attached server)."""

    path: Path | None
    offset: int = 0


@dataclass(frozen=True)
class Compiles:
    """The compile events logged after a mark: how many, and the kernels' names (first seen first, distinct)."""

    count: int = 0
    kernels: tuple[str, ...] = ()
    checked: bool = True  # False: the server's log could not be read, nothing is known

    def describe(self, most: int = 3) -> str:
        names = ", ".join(self.kernels[:most]) + (f" and {len(self.kernels) - most} more" if len(self.kernels) > most
                                                  else "")
        return f"{self.count} kernel compile(s) ({names})"


def mark(path: Path | None) -> LogMark:
    """The end of the log at ``path`` now (offset 0 when it does not exist yet)."""
    if path is None:
        return LogMark(None)
    try:
        return LogMark(path, path.stat().st_size)
    except OSError:
        return LogMark(path, 0)


def compiles_since(start: LogMark) -> Compiles:
    """The compile events appended to the log after ``start`` (a log that shrank was rotated: read it whole)."""
    if start.path is None:
        return Compiles(checked=False)
    try:
        with start.path.open("rb") as fh:
            fh.seek(0, 2)
            fh.seek(start.offset if fh.tell() >= start.offset else 0)
            text = fh.read().decode(errors="replace")
    except OSError:
        return Compiles(checked=False)
    count, kernels = 0, dict[str, None]()
    for line in text.splitlines():
        found = _EVENT.search(line)
        if found is not None:
            count += 1
            kernels.setdefault(found["kernel"].rstrip("."), None)
    return Compiles(count, tuple(kernels))
