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
from pytest_moeperf.settings.checks import at_least, describe, http_url, input_file, number_in, output_path

__all__ = ["MAX_SUM_ERROR", "main_attribute"]

MAX_SUM_ERROR = 0.05  # the parts must tile the traced step within 5 %


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="moeperf attribute", description=__doc__.split("\n\n")[0])
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--url", type=http_url, help="base URL of a running vLLM server started with --profiler-config")
    src.add_argument("--trace", metavar="FILE", type=_trace_file, action="append",
                     help="attribute a saved worker trace (repeatable) instead of profiling")
    p.add_argument("--trace-dir", metavar="DIR", type=Path,
                   help="the server's torch_profiler_dir as seen from here (required with --url)")
    p.add_argument("--batch", type=at_least(1), nargs="+", default=None, metavar="N",
                   help="concurrent streams per window = decode batch (with --url default: 1 8 32; with --trace "
                   "default: the most frequent decode batch in the trace)")
    p.add_argument("--decode-tokens", type=at_least(1), default=32, metavar="K",
                   help="token chunks each stream receives while the profiler runs (default: %(default)s)")
    p.add_argument("--max-tokens", type=at_least(1), default=512, metavar="M",
                   help="output length per stream; must outlast the window (default: %(default)s)")
    p.add_argument("--rank", type=at_least(0), default=0,
                   help="which worker trace of a window to attribute (with --url; default: 0)")
    p.add_argument("--timeout", type=number_in(0.0, strict=True), default=300.0, metavar="S",
                   help="seconds per window (default: %(default)s)")
    p.add_argument("--markdown", action="store_true", help="print Markdown instead of terminal columns")
    p.add_argument("--json", metavar="PATH", type=output_path, help="also write the attributions as JSON")
    return p


def _trace_file(text: str) -> Path:
    """A saved trace: an existing ``.json`` or ``.json.gz`` file (checked here: HTA prints its own complaints)."""
    path = input_file(text)
    if not path.name.endswith((".json", ".gz")):
        raise argparse.ArgumentTypeError(f"{path}: a trace file ends in .json or .json.gz")
    return path


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


def _attribute(path: Path, batch: int | None) -> Attribution:
    """`attribute_trace` of a saved file; a file HTA cannot parse is a `TraceError` naming it."""
    try:
        return attribute_trace(path, batch=batch)
    except TraceError:
        raise
    except (AttributeError, KeyError, TypeError, ValueError, OSError, EOFError) as exc:
        raise TraceError(f"{path}: not a readable torch profiler trace ({type(exc).__name__}: "
                         f"{describe(exc)})") from None


def main_attribute(argv: Sequence[str] | None = None, *, out: Callable[[str], Any] = print) -> int:
    """0: every table's parts sum to its step within 5 %; 1: one does not; 2: bad arguments or no result."""
    parser = _parser()
    args = parser.parse_args(list(argv) if argv is not None else None)
    if args.url and args.trace_dir is None:
        parser.error("--url needs --trace-dir (the server's torch_profiler_dir)")
    if args.url and args.trace_dir.exists() and not args.trace_dir.is_dir():
        parser.error(f"--trace-dir {args.trace_dir} is a file, not a directory")
    from pytest_moeperf.attribution.window import WindowError

    client_errors: tuple[type[BaseException], ...] = ()
    if args.url:
        import aiohttp  # only attach mode talks HTTP

        client_errors = (aiohttp.ClientError,)

    try:
        if args.url:
            results = _from_url(args)
        else:
            batches = args.batch or [None]
            results = [_attribute(path, b) for path in args.trace for b in batches]
    except client_errors as exc:
        print(f"moeperf attribute: {args.url}: {describe(exc)} (is a vLLM server listening there?)", file=sys.stderr)
        return 2
    except (KeyError, IndexError) as exc:
        print(f"moeperf attribute: {args.url}/v1/models lists no model ({describe(exc)}): is it a vLLM server?",
              file=sys.stderr)
        return 2
    except (OSError, TraceError, WindowError, ValueError) as exc:
        print(f"moeperf attribute: {describe(exc)}", file=sys.stderr)
        return 2
    for i, a in enumerate(results):
        out("") if i else None
        for line in attribution_markdown(a) if args.markdown else attribution_lines(a):
            out(line)
    if args.json is not None:
        try:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps([a.to_json() for a in results], indent=2, sort_keys=True) + "\n")
        except OSError as exc:
            print(f"moeperf attribute: cannot write {args.json}: {describe(exc)}", file=sys.stderr)
            return 2
    bad = [a for a in results if a.sum_error > MAX_SUM_ERROR]
    for a in bad:
        print(f"moeperf attribute: batch {a.batch}: parts are {100 * a.sum_error:.1f} % off the step time "
              f"(> {100 * MAX_SUM_ERROR:.0f} %): overlapping streams or events outside the step", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main_attribute())
