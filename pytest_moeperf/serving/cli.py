"""``moeperf serve PROFILE``: start the vLLM server a serve profile describes, print its URL, keep it up until
interrupted, then stop it.

For work against a server the suites did not start: ``moeperf attribute --url`` (with ``--profiler-dir``, so
the server writes torch profiler traces), ``python -m pytest_moeperf.serving.crosscheck``, attach mode
(``--moeperf-server-url``), or ``vllm bench serve``. ``--interconnect-emulation`` starts it under an NCCL
emulation (``emulation.py``) with the same refusal rules as the pytest option. vLLM's compile caches go beside
the model cache (``.moeperf/vllm-cache``), so a repeat start reuses them, as do the suites' starts under
``moeperf batch`` or ``MOEPERF_SERVE_CACHE=.moeperf`` (`lifecycle.caches.MODELS_DIR`).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from pytest_moeperf.serving.lifecycle.caches import COMPILED_DIR, MODELS_DIR
from pytest_moeperf.serving.models.profiles import DEFAULT_DIR as DEFAULT_PROFILES
from pytest_moeperf.settings.checks import describe, number_in, output_path

__all__ = ["main_serve"]


def _parser() -> argparse.ArgumentParser:
    from pytest_moeperf.machine.emulation import names

    p = argparse.ArgumentParser(prog="moeperf serve", description=__doc__.split("\n\n")[0])
    p.add_argument("profile", help="serve profile name (a *.json in --profiles)")
    p.add_argument("--profiles", metavar="DIR", type=Path, action="append",
                   help=f"serve profile directory (repeatable; default: {DEFAULT_PROFILES})")
    p.add_argument("--profiler-dir", metavar="DIR", type=Path,
                   help="turn vLLM's torch profiler on, writing worker traces to DIR (for moeperf attribute)")
    p.add_argument("--interconnect-emulation", choices=names(), default=None,
                   help="start the server under this NCCL interconnect emulation")
    p.add_argument("--model-cache", metavar="DIR", type=Path, default=Path(".moeperf") / MODELS_DIR,
                   help="where generated models are written (default: %(default)s)")
    p.add_argument("--log-dir", metavar="DIR", type=Path, default=Path(".moeperf/logs"),
                   help="the server's log goes here (default: %(default)s)")
    p.add_argument("--timeout", metavar="S", type=number_in(0.0, strict=True), default=600.0,
                   help="seconds to wait for /health (default: %(default)s)")
    p.add_argument("--url-file", metavar="PATH", type=output_path, help="also write the base URL to PATH once healthy")
    return p


def main_serve(argv: Sequence[str] | None = None) -> int:
    """0: served until interrupted; 2: bad profile, refused emulation, or the server did not come up."""
    from pytest_moeperf.attribution.window import profiler_args
    from pytest_moeperf.machine import emulation, probe
    from pytest_moeperf.serving.lifecycle.pool import ServerPool, ServeSkip
    from pytest_moeperf.serving.lifecycle.server import ServerDied, ServerStartError
    from pytest_moeperf.serving.lifecycle.starts import gpu_local_cpus
    from pytest_moeperf.serving.models.profiles import ProfileError, load_profile_dirs

    args = _parser().parse_args(list(argv) if argv is not None else None)

    def fail(message: str) -> int:
        print(f"moeperf serve: {message}", file=sys.stderr)
        return 2

    if not args.profiles and not DEFAULT_PROFILES.is_dir():
        return fail(f"no {DEFAULT_PROFILES} here: run from the project root or pass --profiles DIR")
    folders = args.profiles or [DEFAULT_PROFILES]
    for option, folder in [("--profiles", f) for f in folders] + [
            ("--profiler-dir", args.profiler_dir), ("--model-cache", args.model_cache), ("--log-dir", args.log_dir)]:
        if folder is not None and folder.exists() and not folder.is_dir():
            return fail(f"{option} {folder} is a file, not a directory")
    try:
        profiles = load_profile_dirs(folders)
    except (OSError, ProfileError) as exc:
        return fail(describe(exc))
    if not profiles:
        return fail(f"no profile {args.profile!r}: {', '.join(map(str, folders))} holds no *.json profiles")
    if args.profile not in profiles:
        return fail(f"no profile {args.profile!r}; known: {', '.join(sorted(profiles))}")
    profile = profiles[args.profile]
    topology = probe.probe()
    env = dict(profile.env)
    if args.interconnect_emulation:
        reason = emulation.check(args.interconnect_emulation, topology, {**os.environ, **env})
        if reason is not None:
            return fail(reason)
        env.update(emulation.emulation_env(args.interconnect_emulation))
    extra: tuple[str, ...] = ()
    try:
        if args.profiler_dir is not None:
            args.profiler_dir.mkdir(parents=True, exist_ok=True)
            extra = tuple(profiler_args(args.profiler_dir))
        args.log_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return fail(f"cannot create a directory: {describe(exc)}")
    profile = dataclasses.replace(profile, env=env, vllm_args=(*profile.vllm_args, *extra))
    pool = ServerPool({profile.name: profile}, timeout_s=args.timeout, gpu_count=topology.gpu_count,
                      model_cache=args.model_cache.resolve(), log_dir=args.log_dir,
                      compile_cache=args.model_cache.resolve().parent / COMPILED_DIR,
                      gpu_cpus=gpu_local_cpus(topology))
    stop, launched = threading.Event(), threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        if not launched.is_set():
            raise KeyboardInterrupt  # still starting: the pool stops the half-started server itself
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        print(f"moeperf serve: starting {profile.name} (log in {args.log_dir})", flush=True)
        try:
            served = pool.launch(profile)
        except (ServeSkip, ServerStartError) as exc:
            return fail(str(exc))
        except KeyboardInterrupt:
            return fail(f"interrupted while {profile.name} was starting; stopped it")
        launched.set()
        url = served.server.base_url
        print(f"moeperf serve: {profile.name} healthy after {served.startup_s:.1f} s at {url}"
              f"{f' under {args.interconnect_emulation}' if args.interconnect_emulation else ''}", flush=True)
        if args.url_file is not None:
            try:
                args.url_file.parent.mkdir(parents=True, exist_ok=True)
                args.url_file.write_text(url + "\n")
            except OSError as exc:
                served.server.stop()
                return fail(f"cannot write --url-file {args.url_file}: {describe(exc)}")
        try:
            while not stop.wait(1.0):
                served.server.alive_or_raise()
        except ServerDied as exc:  # the server died under us: say so, exit non-zero
            return fail(str(exc))
        finally:
            served.server.stop()
        print(f"moeperf serve: {profile.name} stopped", flush=True)
        return 0
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


if __name__ == "__main__":
    raise SystemExit(main_serve())
