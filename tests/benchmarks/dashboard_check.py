"""Build the dashboard of a history made by ``dashboard_history.py`` and say whether it found the injected step where
it was: for each host, the change points of the GEMM families on the index and on every GEMM metric page, against
``OUT/expected.json``. Takes the screenshots (``scripts/report-screenshot.sh``, headless Chromium) as well.

    python tests/benchmarks/dashboard_check.py --out /tmp/dash-history [--min-magnitude 0]
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def payload(page: Path) -> dict[str, Any]:
    found = re.search(r"window\.MOEPERF_PAGE = (.*?);</script>", page.read_text())
    assert found, page
    data: dict[str, Any] = json.loads(found.group(1))
    return data


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="dashboard_history.py's --out")
    parser.add_argument("--min-magnitude", default="0")
    args = parser.parse_args()
    expected = json.loads((args.out / "expected.json").read_text())
    site = args.out / "site"
    subprocess.run([sys.executable, "-m", "pytest_moeperf.cli", "dashboard", "--db", str(args.out / "history.sqlite"),
                    "--out", str(site), "--min-magnitude", args.min_magnitude], check=True, cwd=ROOT)
    data = json.loads((site / "data" / "sessions.js").read_text().split("= ", 1)[1].rstrip(";\n"))
    sessions, hosts = data["sessions"], [lane["host"] for lane in data["lanes"]]
    commit_of = {sid: row[1] for sid, row in sessions.items()}
    step = expected["step_commit"]
    index = payload(site / "index.html")
    print(f"expected first injected commit per host: { {h: c[:10] for h, c in step.items()} }")
    for row in index["rows"]:
        for lane in row["lanes"]:
            groups = [(commit_of[str(g["s"])][:10], f"{g['n']}/{lane['of']}", f"{g['rel'] * 100:+.1f} %")
                      for g in lane["steps"]]
            mark = ""
            if groups:
                top = lane["steps"][0]
                mark = " <- the injected step" if commit_of[str(top["s"])] == step.get(hosts[lane["lane"]]) else ""
            print(f"index {row['file'].split('/')[-1]} {row['metric']:>16} {hosts[lane['lane']]}: "
                  f"{groups or 'no change point'}{mark}")
    pages = sorted((site / "m").glob("test_gemm.py_*.html"))
    found: Counter[str] = Counter()
    for page in pages:
        for lane in payload(page)["lanes"]:
            host = hosts[lane["lane"]]
            commits = [commit_of[str(s["s"])] for s in lane["steps"]]
            found["pages"] += 1
            found["right commit"] += step.get(host) in commits
            found["other change points"] += sum(c != step.get(host) for c in commits)
    print(f"GEMM metric pages x hosts: {found['pages']}; with a change point at the injected commit: "
          f"{found['right commit']}; change points elsewhere: {found['other change points']}")
    script = ROOT / "scripts" / "report-screenshot.sh"
    subprocess.run([str(script), str(site / "index.html"), str(args.out / "index.png"), "1280,1000"], check=True)
    time_page = next(p for p in pages if "m1-bf16_time" in p.name and "o_proj" in p.name)
    subprocess.run([str(script), str(time_page), str(args.out / "metric.png"), "1280,1500"], check=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
