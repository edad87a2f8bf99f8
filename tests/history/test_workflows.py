"""The GitHub workflows: valid against GitHub's workflow schema (check-jsonschema ships it and runs offline), no
GPU job for a fork's pull request, a baseline update that opens a reviewed pull request, reports as artifacts,
least-privilege token permissions, and every action pinned to a commit (a tag can be moved to other code)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

WORKFLOWS = sorted((Path(__file__).resolve().parents[2] / ".github" / "workflows").glob("*.yml"))
FORK_GUARD = "github.event.pull_request.head.repo.full_name == github.repository"
#: the token each workflow needs, no more: read the code; the baseline update pushes a branch and opens a PR
PERMISSIONS = {"ci.yml": {"contents": "read"}, "gpu.yml": {"contents": "read"},
               "baselines-update.yml": {"contents": "write", "pull-requests": "write"}}
PINNED = re.compile(r"[\w.-]+/[\w.-]+(/[\w./-]+)?@[0-9a-f]{40}")


def load(path: Path) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(path.read_text())
    if True in doc:  # YAML 1.1 reads the key `on` as a boolean
        doc["on"] = doc.pop(True)
    return doc


def self_hosted(job: dict[str, Any]) -> bool:
    runs_on = job.get("runs-on", [])
    return "self-hosted" in ([runs_on] if isinstance(runs_on, str) else runs_on)


def steps(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [step for job in doc["jobs"].values() for step in job.get("steps", [])]


def test_there_are_workflows_to_check() -> None:
    assert {p.name for p in WORKFLOWS} >= {"ci.yml", "gpu.yml", "baselines-update.yml"}


def test_workflows_match_githubs_schema() -> None:
    done = subprocess.run([sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.github-workflows",
                           *map(str, WORKFLOWS)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ok -- validation done" in done.stdout


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_gpu_jobs_never_run_for_a_forks_pull_request(path: Path) -> None:
    doc = load(path)
    triggers = doc["on"] if isinstance(doc["on"], dict) else {name: None for name in doc["on"]}
    gpu_jobs = {name: job for name, job in doc["jobs"].items() if self_hosted(job)}
    if gpu_jobs:
        assert "pull_request_target" not in triggers, "pull_request_target runs a fork's code with this repo's secrets"
    for name, job in gpu_jobs.items():
        condition = " ".join(str(job.get("if", "")).split())
        assert FORK_GUARD in condition, f"{path.name}: job {name} runs on a GPU box without the fork guard"
        assert condition.startswith("github.event_name != 'pull_request' ||"), condition


def test_the_gpu_workflow_runs_for_own_pull_requests_and_nightly() -> None:
    triggers = load(next(p for p in WORKFLOWS if p.name == "gpu.yml"))["on"]
    assert {"pull_request", "schedule", "workflow_dispatch"} <= set(triggers)


def test_baseline_update_opens_a_pull_request_with_the_diff_and_provenance() -> None:
    doc = load(next(p for p in WORKFLOWS if p.name == "baselines-update.yml"))
    runs = [str(step.get("run", "")) for step in steps(doc)]
    [create] = [r for r in runs if "gh pr create" in r]
    body = create.split("--body-file", 1)[1].split()[0]
    [writer] = [r for r in runs if f"> {body}" in r]
    diff_file = writer.split("moeperf baselines diff >", 1)[1].split()[0]
    assert f"cat {diff_file}" in writer, "the diff is the body's table"
    for provenance in ("$GITHUB_SHA", "$RUNNER_NAME", "moeperf topology", "date -u", "$PYTEST_ARGS"):
        assert provenance in writer, provenance
    assert "${{" not in create + writer, "inputs reach the shell through env, never pasted into a script"
    assert doc["permissions"] == {"contents": "write", "pull-requests": "write"}


@pytest.mark.parametrize("name", ["ci.yml", "gpu.yml", "baselines-update.yml"])
def test_reports_and_history_are_uploaded(name: str) -> None:
    doc = load(next(p for p in WORKFLOWS if p.name == name))
    uploads = [s for s in steps(doc) if str(s.get("uses", "")).startswith("actions/upload-artifact@")]
    assert uploads and all(s.get("if") == "always()" for s in uploads), "reports are kept when the run fails too"
    paths = "\n".join(str(s["with"]["path"]) for s in uploads)
    assert "moeperf-report.html" in paths and "moeperf-report.json" in paths
    assert "history.sqlite" in paths
    suites = [str(s.get("run", "")) for s in steps(doc) if "tox -e suites -- " in str(s.get("run", ""))]
    for command in suites:
        assert "--moeperf-history" in command and "--moeperf-html .tox/moeperf-report.html" in command, command


@pytest.mark.parametrize("name", ["gpu.yml", "baselines-update.yml"])
def test_gpu_workflows_install_a_pinned_vllm_and_fail_without_it(name: str) -> None:
    doc = load(next(p for p in WORKFLOWS if p.name == name))
    (job,) = doc["jobs"].values()
    assert "vllm==" in job["env"]["MOEPERF_VLLM"], "a pinned default"
    runs = [str(s.get("run", "")) for s in steps(doc)]
    install = next(i for i, r in enumerate(runs) if 'pip install -q "$MOEPERF_VLLM"' in r)
    assert ".tox/suites/bin/python -m pip install" in runs[install], "into the environment the suites run in"
    assert "import vllm" in runs[install], "a missing vLLM fails the job instead of skipping its suites"
    suites = next(i for i, r in enumerate(runs) if "tox -e suites -- " in r)
    assert install < suites


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_every_workflow_declares_least_privilege_permissions(path: Path) -> None:
    """Without a ``permissions:`` block a job gets the repository's default token, which may write (issue 22,
    item 10)."""
    doc = load(path)
    assert doc.get("permissions") == PERMISSIONS[path.name], f"{path.name}: permissions {doc.get('permissions')!r}"
    for name, job in doc["jobs"].items():
        granted = job.get("permissions", {})
        assert isinstance(granted, dict) and all(PERMISSIONS[path.name].get(k) == v for k, v in granted.items()), (
            f"{path.name}: job {name} widens the workflow's permissions: {granted!r}")


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_every_action_is_pinned_to_a_commit_with_its_tag_beside_it(path: Path) -> None:
    """``uses: owner/action@<40 hex>  # vX.Y.Z``: a tag can be moved to other code, a commit cannot; the comment
    says which release the commit is (issue 22, item 10)."""
    lines = path.read_text().splitlines()
    uses = [str(step["uses"]) for step in steps(load(path)) if "uses" in step]
    uses += [str(job["uses"]) for job in load(path)["jobs"].values() if "uses" in job]  # reusable workflows
    assert uses, f"{path.name} uses no action"
    for action in uses:
        assert action.startswith("./") or PINNED.fullmatch(action), f"{path.name}: {action} is not pinned to a commit"
        for line in (line for line in lines if line.split("#", 1)[0].strip().endswith(f"uses: {action}")):
            assert re.search(r"#\s*v\d+(\.\d+)*\s*$", line), f"{path.name}: {line.strip()!r} names no release tag"


def test_checkouts_that_run_untrusted_code_keep_no_token() -> None:
    """The CI and GPU jobs run a pull request's code after the checkout: the token is not left in .git/config for
    it (the baseline update keeps it: it pushes its branch)."""
    for name in ("ci.yml", "gpu.yml"):
        doc = load(next(p for p in WORKFLOWS if p.name == name))
        checkouts = [s for s in steps(doc) if str(s.get("uses", "")).startswith("actions/checkout@")]
        assert checkouts and all(s.get("with", {}).get("persist-credentials") is False for s in checkouts), name
