"""``moeperf attribute``: profile decode-only windows of a running vLLM server (or read saved traces) and print
the per-component decode-step table.

Attach mode needs the server started with its torch profiler on (``profiler_args`` prints the flag) and
``--trace-dir`` naming its ``torch_profiler_dir`` as this machine sees it (same host, or a shared mount).
Starting a server (``--launch``) belongs to the serving wing and is not here.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pytest_moeperf.attribution.table import attribution_lines, attribution_markdown
from pytest_moeperf.attribution.trace import Attribution, TraceError, attribute_trace

__all__ = ["MAX_SUM_ERROR", "main_attribute"]

MAX_SUM_ERROR = 0.05  # the parts must tile the traced step within 5 %


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="moeperf attribute", description=__doc__.split("\n\n")[0])
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--url", help="base URL of a running vLLM server started with --profiler-config")
    src.add_argument("--trace", metavar="FILE", type=Path, action="append",
                     help="attribute a saved worker trace (repeatable) instead of profiling")
    p.add_argument("--trace-dir", metavar="DIR", type=Path,
                   help="the server's torch_profiler_dir as seen from here (required with --url)")
    p.add_argument("--batch", type=int, nargs="+", default=None, metavar="N",
                   help="concurrent streams per window = decode batch (with --url default: 1 8 32; with --trace "
                   "default: the most frequent decode batch in the trace)")
    p.add_argument("--decode-tokens", type=int, default=32, metavar="K",
                   help="token chunks each stream receives while the profiler runs (default: %(default)s)")
    p.add_argument("--max-tokens", type=int, default=512, metavar="M",
                   help="output length per stream; must outlast the window (default: %(default)s)")
    p.add_argument("--rank", type=int, default=0, help="which worker trace of a window to attribute (default: 0)")
    p.add_argument("--timeout", type=float, default=300.0, metavar="S", help="per window (default: %(default)s)")
    p.add_argument("--markdown", action="store_true", help="print Markdown instead of terminal columns")
    p.add_argument("--json", metavar="PATH", type=Path, help="also write the attributions as JSON")
    return p


def _to_json(a: Attribution) -> dict[str, Any]:
    return {"source": a.source, "device": a.device, "batch": a.batch, "steps": a.steps, "step_us": a.step_us,
            "component_us": dict(a.component_us), "idle_us": a.idle_us, "idle_label": a.idle_label,
            "shares_pct": {c: a.share_pct(c) for c in a.component_us}, "idle_share_pct": a.idle_share_pct,
            "sum_error": a.sum_error}


def _from_url(args: argparse.Namespace) -> list[Attribution]:
    """Profile every window first, then attribute: the traces are kept even when attribution fails."""
    from pytest_moeperf.attribution.window import profile_decode_window

    windows = []
    for batch in args.batch or [1, 8, 32]:
        window = profile_decode_window(args.url, args.trace_dir, batch=batch, decode_tokens=args.decode_tokens,
                                       max_tokens=args.max_tokens, timeout_s=args.timeout)
        if args.rank >= len(window.traces):
            raise TraceError(f"window batch={batch} wrote {len(window.traces)} worker trace(s), no rank {args.rank}")
        print(f"moeperf attribute: batch {batch}: {window.chunks} chunks in {window.profiled_s:.2f} s, "
              f"traces {', '.join(str(t) for t in window.traces)}", file=sys.stderr)
        windows.append((batch, window.traces[args.rank]))
    return [attribute_trace(trace, batch=batch) for batch, trace in windows]


def main_attribute(argv: Sequence[str] | None = None, *, out: Callable[[str], Any] = print) -> int:
    """0: every table's parts sum to its step within 5 %; 1: one does not; 2: bad arguments or no result."""
    parser = _parser()
    args = parser.parse_args(list(argv) if argv is not None else None)
    if args.url and args.trace_dir is None:
        parser.error("--url needs --trace-dir (the server's torch_profiler_dir)")
    from pytest_moeperf.attribution.window import WindowError

    try:
        if args.url:
            results = _from_url(args)
        else:
            batches = args.batch or [None]
            results = [attribute_trace(path, batch=b) for path in args.trace for b in batches]
    except (OSError, TraceError, WindowError, ValueError) as exc:
        print(f"moeperf attribute: {exc}", file=sys.stderr)
        return 2
    for i, a in enumerate(results):
        out("") if i else None
        for line in attribution_markdown(a) if args.markdown else attribution_lines(a):
            out(line)
    if args.json is not None:
        args.json.write_text(json.dumps([_to_json(a) for a in results], indent=2, sort_keys=True) + "\n")
    bad = [a for a in results if a.sum_error > MAX_SUM_ERROR]
    for a in bad:
        print(f"moeperf attribute: batch {a.batch}: parts are {100 * a.sum_error:.1f} % off the step time "
              f"(> {100 * MAX_SUM_ERROR:.0f} %): overlapping streams or events outside the step", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main_attribute())
