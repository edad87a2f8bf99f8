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
PERMISSIONS = {"ci.yml": {"contents": "read"}, "gpu.yml": {"contents": "read"}, "ab.yml": {"contents": "read"},
               "baselines-update.yml": {"contents": "write", "pull-requests": "write"}}
#: a job that needs more than its workflow grants: only on a hosted runner, with no checkout (no code of the PR)
JOB_GRANTS = {("ab.yml", "comment"): {"pull-requests": "write"}}
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
    assert {p.name for p in WORKFLOWS} >= {"ci.yml", "gpu.yml", "baselines-update.yml", "ab.yml"}


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
        if (path.name, name) in JOB_GRANTS:
            assert granted == JOB_GRANTS[path.name, name], f"{path.name}: job {name}: {granted!r}"
            assert not self_hosted(job) and not any("uses" in step for step in job.get("steps", [])), (
                f"{path.name}: job {name} holds a write token: no checkout, no action, no self-hosted runner")
            continue
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
    for name in ("ci.yml", "gpu.yml", "ab.yml"):
        doc = load(next(p for p in WORKFLOWS if p.name == name))
        checkouts = [s for s in steps(doc) if str(s.get("uses", "")).startswith("actions/checkout@")]
        assert checkouts and all(s.get("with", {}).get("persist-credentials") is False for s in checkouts), name


# ------------------------------------------------------------------------------------------------ ab.yml
def evaluate(condition: str, context: dict[str, Any]) -> bool:
    """A job's ``if:`` (the subset of GitHub's expressions these workflows use: ``github.*`` properties, string
    literals, ``==``, ``!=``, ``&&``, ``||``, parentheses) in a context; a property not in it is null."""
    text = " ".join(condition.split())
    assert re.fullmatch(r"(github\.[\w.]+|'[^']*'|==|!=|&&|\|\||[() ])*", text), f"outside the subset: {text}"
    python = re.sub(r"github\.[\w.]+", lambda m: repr(context.get(m.group(0))), text)
    return bool(eval(python.replace("&&", " and ").replace("||", " or "), {"__builtins__": {}}))  # noqa: S307


@pytest.mark.parametrize(("event", "repo", "action", "label", "runs"), [
    ("pull_request", "org/repo", "opened", None, True),  # a branch of this repository: every push
    ("pull_request", "org/repo", "synchronize", None, True),
    ("pull_request", "org/repo", "labeled", "moeperf-ab", True),  # a maintainer asks again
    ("pull_request", "org/repo", "labeled", "docs", False),  # another label: no second run of the same commit
    ("pull_request", "fork/repo", "opened", None, False),  # a fork: never on its own
    ("pull_request", "fork/repo", "synchronize", None, False),  # a push after the label: not until labelled again
    ("pull_request", "fork/repo", "labeled", "docs", False),
    ("pull_request", "fork/repo", "labeled", "moeperf-ab", True),  # a maintainer reviewed it and labelled it
    ("workflow_dispatch", None, None, None, True),
])
def test_ab_runs_a_forks_code_only_after_a_maintainers_label(event: str, repo: str | None, action: str | None,
                                                             label: str | None, runs: bool) -> None:
    doc = load(next(p for p in WORKFLOWS if p.name == "ab.yml"))
    context = {"github.event_name": event, "github.repository": "org/repo", "github.event.action": action,
               "github.event.pull_request.head.repo.full_name": repo, "github.event.label.name": label}
    assert evaluate(doc["jobs"]["ab"]["if"], context) is runs
    assert set(doc["on"]["pull_request"]["types"]) == {"opened", "synchronize", "reopened", "labeled"}


def test_ab_compares_the_reviewed_head_with_its_merge_base_and_fails_on_a_regression() -> None:
    doc = load(next(p for p in WORKFLOWS if p.name == "ab.yml"))
    job = doc["jobs"]["ab"]
    assert self_hosted(job) and "gpu" in job["runs-on"]
    [checkout] = [s for s in job["steps"] if str(s.get("uses", "")).startswith("actions/checkout@")]
    assert checkout["with"]["ref"].startswith("${{ github.event.pull_request.head.sha")  # not a later push
    assert checkout["with"]["fetch-depth"] == 0 and checkout["with"]["persist-credentials"] is False
    assert "github.event.pull_request.head.sha" in job["env"]["HEAD_REV"]
    assert "github.event.pull_request.base.sha" in job["env"]["BASE_REV"]
    runs = [str(s.get("run", "")) for s in job["steps"]]
    [ab] = [r for r in runs if "moeperf ab" in r]
    assert 'git merge-base "$BASE_REV" "$HEAD_REV"' in ab
    assert '--base-ref "$base" --head-ref "$HEAD_REV"' in ab and "--markdown .tox/moeperf-ab.md" in ab
    assert '>> "$GITHUB_STEP_SUMMARY"' in ab and ab.rstrip().endswith("exit $status"), "a regression fails the job"
    assert "${{" not in "".join(runs + [str(s.get("run", "")) for s in doc["jobs"]["comment"]["steps"]]), (
        "inputs and outputs reach the shell through env, never pasted into a script")
    comment = doc["jobs"]["comment"]
    assert "gh pr comment" in comment["steps"][0]["run"] and comment["needs"] == "ab"
    assert FORK_GUARD in " ".join(comment["if"].split())  # a fork's token cannot comment: the job page has it
    uploads = [s for s in job["steps"] if str(s.get("uses", "")).startswith("actions/upload-artifact@")]
    assert uploads and all(s.get("if") == "always()" for s in uploads)
    assert "moeperf-ab.json" in uploads[0]["with"]["path"]


def test_the_gpu_workflow_builds_the_dashboard_of_its_history_and_uploads_it() -> None:
    doc = load(next(p for p in WORKFLOWS if p.name == "gpu.yml"))
    all_steps = steps(doc)
    [suites] = [s for s in all_steps if "tox -e suites -- " in str(s.get("run", ""))]
    [build] = [s for s in all_steps if "moeperf dashboard" in str(s.get("run", ""))]
    assert build["env"]["MOEPERF_HISTORY"] == suites["env"]["MOEPERF_HISTORY"], "the history the suites append to"
    assert '--db "$MOEPERF_HISTORY"' in build["run"] and build.get("if") == "always()"
    out = build["run"].split("--out", 1)[1].split()[0]
    assert all_steps.index(suites) < all_steps.index(build)
    uploads = [s for s in all_steps[all_steps.index(build):] if str(s.get("uses", "")).startswith("actions/upload")]
    assert any(str(s["with"]["path"]).strip() == out and s.get("if") == "always()" for s in uploads)
