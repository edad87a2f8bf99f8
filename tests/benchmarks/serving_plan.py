"""The GPU serving plan's predicted time: each window of the TP=1 tiny profiles on 1x H200 (what `moeperf batch
serving` runs there), per start and per batch of S starts, from the time model (`pytest_moeperf.serving.load.timing`).

    PYTHONPATH=. python tests/benchmarks/serving_plan.py [--starts S] [--start-s SECONDS]

Prints a Markdown table (the one in suites/serving/README.md, "Time")."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "serving"))

from test_plan_time import tp1_plan  # noqa: E402 (the plan as the unit test reads it)

from pytest_moeperf.serving.load.timing import (  # noqa: E402
    H200_TP1,
    MEASURED_SCALE,
    PROCESS_S,
    START_S,
    batch_seconds,
    window_seconds,
)
from pytest_moeperf.settings import GPU_STARTS  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--starts", type=int, default=GPU_STARTS)
    parser.add_argument("--start-s", type=float, default=START_S)
    args = parser.parse_args()
    plan = tp1_plan()
    print("| server | window | requests (plateau + ramp + drain) | warm | output tokens | predicted s |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    total = 0.0
    for w in plan:
        seconds = window_seconds(w, H200_TP1[w.server])
        total += seconds
        print(f"| {w.server} | {w.test} | {w.requests} | {w.warm} | {w.output_len} | {seconds:.1f} |")
    print(f"\nwindows a start: {total:.0f} s by the table; with its process ({PROCESS_S:.0f} s), times the measured "
          f"start's ratio {MEASURED_SCALE}, and a server start ({args.start_s:.0f} s): "
          f"{batch_seconds(plan, H200_TP1, 1, args.start_s):.0f} s; {args.starts} starts: "
          f"{batch_seconds(plan, H200_TP1, args.starts, args.start_s):.0f} s")


if __name__ == "__main__":
    main()
