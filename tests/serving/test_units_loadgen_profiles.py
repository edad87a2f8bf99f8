"""Pure pieces of the load generator (arrival times, datasets) and the serve-profile loader."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pytest

from pytest_moeperf.serving.lifecycle.ports import free_port
from pytest_moeperf.serving.load.loadgen import ClosedLoop, LoadGenerator, OpenLoop, Request, arrival_offsets
from pytest_moeperf.serving.load.prompts import prompt_set_requests, random_token_requests, spread_outputs
from pytest_moeperf.serving.models.profiles import ProfileError, launch_blocker, load_profiles

REPO = Path(__file__).parents[2]


def test_poisson_arrivals_have_the_requested_rate_and_are_seeded() -> None:
    offsets = arrival_offsets(OpenLoop(rate=10.0, seed=3), 4000)
    gaps = [b - a for a, b in zip(offsets, offsets[1:], strict=False)]
    assert offsets[0] == 0.0
    assert statistics.fmean(gaps) == pytest.approx(0.1, rel=0.05)
    assert statistics.pstdev(gaps) / statistics.fmean(gaps) == pytest.approx(1.0, rel=0.08)  # exponential: CV 1
    assert arrival_offsets(OpenLoop(rate=10.0, seed=3), 50) == offsets[:50]


def test_gamma_burstiness_changes_the_spread_not_the_rate() -> None:
    for burstiness, cv in ((0.25, 2.0), (4.0, 0.5)):  # gamma(k): CV = 1/sqrt(k)
        offsets = arrival_offsets(OpenLoop(rate=5.0, burstiness=burstiness, seed=1), 6000)
        gaps = [b - a for a, b in zip(offsets, offsets[1:], strict=False)]
        assert statistics.fmean(gaps) == pytest.approx(0.2, rel=0.08)
        assert statistics.pstdev(gaps) / statistics.fmean(gaps) == pytest.approx(cv, rel=0.1)
    assert arrival_offsets(OpenLoop(rate=math.inf), 3) == [0.0, 0.0, 0.0]


def test_shape_validation_and_labels() -> None:
    assert ClosedLoop(4).label == "c4" and OpenLoop(8.0).label == "r8" and OpenLoop(8.0, 0.5).label == "r8b0.5"
    for bad in (lambda: ClosedLoop(0), lambda: OpenLoop(0.0), lambda: OpenLoop(1.0, burstiness=0.0)):
        with pytest.raises(ValueError):
            bad()


def test_random_token_requests_are_exact_and_seeded() -> None:
    reqs = random_token_requests(5, 128, 64, token_range=(16, 512), seed=7)
    assert all(len(r.prompt) == 128 and r.max_tokens == 64 and r.ignore_eos for r in reqs)
    assert all(16 <= t < 512 for r in reqs for t in r.prompt)
    assert reqs == random_token_requests(5, 128, 64, token_range=(16, 512), seed=7)
    assert reqs != random_token_requests(5, 128, 64, token_range=(16, 512), seed=8)
    from_vocab = random_token_requests(3, 50, 8, vocabulary=(7, 11, 13), seed=0)
    assert {t for r in from_vocab for t in r.prompt} <= {7, 11, 13}
    with pytest.raises(ValueError):
        random_token_requests(1, 4, 4, token_range=(5, 5))


def test_bundled_prompt_set_cycles_deterministically() -> None:
    path = REPO / "suites" / "specdecode" / "prompts" / "repetitive.json"
    n = len(json.loads(path.read_text()))
    reqs = prompt_set_requests(path, n + 3, 32, seed=0)
    assert len({r.prompt for r in reqs}) == n and reqs[n].prompt == reqs[0].prompt
    assert reqs == prompt_set_requests(path, n + 3, 32, seed=0)


def test_distinct_prompts_share_no_prefix_and_keep_the_drawn_text() -> None:
    path = REPO / "suites" / "specdecode" / "prompts" / "repetitive.json"
    plain = prompt_set_requests(path, 45, 8, seed=7)
    distinct = prompt_set_requests(path, 45, 8, seed=7, distinct=True)
    assert len({r.prompt for r in plain}) == 20  # cycled: the prefix cache would answer 25 of them
    assert len({str(r.prompt)[:6] for r in distinct}) == 45  # every request opens differently
    assert all(str(d.prompt).endswith(str(p.prompt)) for d, p in zip(distinct, plain, strict=True))
    other_window = prompt_set_requests(path, 45, 8, seed=8, distinct=True)
    assert not {r.prompt for r in distinct} & {r.prompt for r in other_window}


def test_output_spread_keeps_the_mean_and_the_lengths_and_draws_only_their_order() -> None:
    requests = random_token_requests(200, 4, 256, token_range=(16, 100), seed=1)
    a, b = spread_outputs(requests, 0.25, seed=1), spread_outputs(requests, 0.25, seed=2)
    lengths = [r.max_tokens for r in a]
    assert min(lengths) == 192 and max(lengths) == 320 and statistics.mean(lengths) == pytest.approx(256, abs=0.5)
    assert sorted(lengths) == sorted(r.max_tokens for r in b) and lengths != [r.max_tokens for r in b]
    assert [r.prompt for r in a] == [r.prompt for r in requests]
    assert spread_outputs(requests, 0.0) == requests
    with pytest.raises(ValueError, match="output spread"):
        spread_outputs(requests, 1.0)


def test_repo_profiles_load_and_gpu_profiles_skip_here() -> None:
    profiles = load_profiles(REPO / "suites" / "serving" / "profiles")
    assert {"cpu-tiny-nospec", "cpu-tiny-ngram", "kimi-k25-tp8-nospec", "kimi-k25-tp8-eagle3-aqmedai"} <= set(profiles)
    ngram = profiles["cpu-tiny-ngram"]
    argv = ngram.argv("/m", "127.0.0.1", 8123)
    assert argv[argv.index("--speculative-config") + 1].startswith('{"method": "ngram"')
    assert "--load-format" in argv and ngram.reference == "cpu-tiny-nospec"
    kimi = profiles["kimi-k25-tp8-eagle3-lightseek"]
    assert kimi.method == "eagle3" and kimi.tp == 8
    reason = launch_blocker(kimi, gpu_count=0, vllm_importable=True)
    assert reason is not None and "needs 8 GPUs" in reason
    assert launch_blocker(profiles["cpu-tiny-nospec"], gpu_count=0, vllm_importable=True) is None


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ({"name": "p"}, "'model' is required"),
        ({"name": "other", "model": "m"}, "file stem"),
        ({"name": "p", "model": "m", "tp": "8"}, "'tp' has str"),
        ({"name": "p", "model": "m", "device": "tpu"}, "'device'"),
        ({"name": "p", "model": "m", "bogus": 1}, "unknown field"),
        ({"name": "p", "model": "m", "thresholds": {"min_speedup": -1}}, "positive"),
        ({"name": "p", "model": "m", "reference": "nope"}, "no profile"),
        # a tolerance is a fraction: 2 is 200 % (issue 30, item 5)
        ({"name": "p", "model": "m", "tolerances": {"latency": 2}}, "p.json: tolerance 'latency': .*give 0.02"),
        # moeperf owns the bind: loopback, on the port it chose (issue 22, item 8)
        ({"name": "p", "model": "m", "vllm_args": ["--host", "0.0.0.0"]}, "p.json: field 'vllm_args': '--host'"),
        ({"name": "p", "model": "m", "vllm_args": ["--port=8000"]}, "'vllm_args': '--port=8000' .*moeperf binds"),
        ({"name": "p", "model": "m", "vllm_args": ["--hos", "0.0.0.0"]}, "'vllm_args': '--hos' "),  # an abbreviation
        ({"name": "p", "model": "m", "vllm_args": ["--uds", "/tmp/s"]}, "'vllm_args': '--uds' "),
        ({"name": "p", "model": "m", "vllm_args": ["--config", "c.yaml"]}, "'vllm_args': '--config' .*host"),
    ],
)
def test_profile_errors_name_file_and_field(tmp_path: Path, content: dict[str, object], message: str) -> None:
    (tmp_path / "p.json").write_text(json.dumps(content))
    with pytest.raises(ProfileError, match=message):
        load_profiles(tmp_path)


def test_eagle3_head_names_three_hidden_states_the_tiny_target_has() -> None:
    """vLLM feeds an EAGLE-3 head the hidden states after the layers it names (0: the embeddings' output, k: layer
    k's); its input projection takes exactly three. vLLM's default (2, L // 2, L - 3) matches only two of the 2-layer
    tiny MoE's, and the first decode step failed on 1x H200 ("mat1 and mat2 shapes cannot be multiplied")."""
    from pytest_moeperf.serving.models.tinymodel import TinyMoeSpec, eagle3_config

    for layers in (2, 3, 8):
        ids = eagle3_config(TinyMoeSpec(num_hidden_layers=layers))["eagle_aux_hidden_state_layer_ids"]
        assert len(set(ids)) == 3 and all(0 <= i <= layers for i in ids), (layers, ids)


def test_a_refused_request_asks_the_liveness_check_at_once_not_at_the_next_watch_tick() -> None:
    """A dead server's port refuses requests faster than the watch's interval; the first failure must ask."""
    asked: list[int] = []

    async def liveness() -> None:
        asked.append(1)
        if len(asked) > 1:  # the watch's own first look passes: the server was alive when the window began
            raise RuntimeError("server gone")

    gen = LoadGenerator(f"http://127.0.0.1:{free_port()}", "m", liveness=liveness, liveness_interval_s=3600.0)
    with pytest.raises(RuntimeError, match="server gone"):
        gen.run([Request(prompt="x", max_tokens=1)] * 50, ClosedLoop(1))
    assert len(asked) == 2  # the watch's first look, then the first refused request's: not 50
