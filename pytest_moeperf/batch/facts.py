"""What the batch needs to know about the interpreter it runs the steps with, asked *of* that interpreter
(``python -m pytest_moeperf.batch.facts [--vllm]`` prints one JSON object): where this package is imported from,
whether it is installed as a pytest plugin, torch and CUDA, the probed GPU count and fingerprint, and with
``--vllm`` whether vLLM imports (tens of seconds, so only when a step depends on it).

The batch's own interpreter may differ (``moeperf batch --python``), so nothing here is read in-process."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import metadata
from typing import Any

__all__ = ["Facts", "FactsError", "collect", "ask"]


class FactsError(RuntimeError):
    """The interpreter cannot run the batch's steps (it does not import this package, or printed no facts)."""


@dataclass(frozen=True)
class Facts:
    python: str
    package: str
    entry_point: bool
    torch: str | None
    cuda: str | None
    gpu_names: tuple[str, ...]
    gpu_count: int
    vllm: str | None
    vllm_checked: bool
    fingerprint: str

    def describe(self) -> list[str]:
        torch = f"torch {self.torch} (CUDA {self.cuda})" if self.torch else "no torch"
        gpus = ", ".join(self.gpu_names) or "no GPU"
        return [f"python {self.python}; pytest_moeperf from {self.package}"
                f"{'' if self.entry_point else ' (not installed: loaded with -p pytest_moeperf.plugin)'}",
                f"{torch}; {gpus}; {self._vllm()}; fingerprint {self.fingerprint}"]


    def _vllm(self) -> str:
        return "vLLM not checked" if not self.vllm_checked else f"vLLM {self.vllm or 'does not import'}"


def collect(check_vllm: bool) -> dict[str, Any]:
    """The facts of the running interpreter (run in the target interpreter)."""
    import pytest_moeperf
    from pytest_moeperf.machine.probe import probe

    facts: dict[str, Any] = {"python": sys.version.split()[0], "package": str(pytest_moeperf.__file__),
                             "torch": None, "cuda": None, "gpu_names": [], "vllm": None, "vllm_checked": check_vllm}
    facts["entry_point"] = any(e.value == "pytest_moeperf.plugin" for e in metadata.entry_points(group="pytest11"))
    try:
        import torch

        facts["torch"], facts["cuda"] = torch.__version__, torch.version.cuda
        if torch.cuda.is_available():
            facts["gpu_names"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    except Exception:  # noqa: BLE001 (a broken torch is a fact too: the steps will say what failed)
        pass
    if check_vllm:
        try:
            import vllm

            facts["vllm"] = str(vllm.__version__)
        except Exception:  # noqa: BLE001 (vLLM missing or unimportable: its steps skip)
            pass
    topo = probe()
    facts["gpu_count"], facts["fingerprint"] = topo.gpu_count, topo.fingerprint.slug
    return facts


def ask(python: str, env: Mapping[str, str], cwd: str, *, check_vllm: bool) -> Facts:
    """Run this module under ``python`` and read its answer."""
    try:
        done = subprocess.run([python, "-m", "pytest_moeperf.batch.facts", *(["--vllm"] if check_vllm else [])],
                              env=dict(env), cwd=cwd,
                              capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise FactsError(f"cannot run {python}: {exc}") from None
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise FactsError(f"{python} cannot import pytest_moeperf ({tail}): install the project into it or put "
                         "the checkout on PYTHONPATH")
    raw = json.loads(lines[-1])
    return Facts(python=raw["python"], package=raw["package"], entry_point=bool(raw["entry_point"]),
                 torch=raw["torch"], cuda=raw["cuda"], gpu_names=tuple(raw["gpu_names"]),
                 gpu_count=int(raw["gpu_count"]), vllm=raw["vllm"],
                 vllm_checked=bool(raw["vllm_checked"]), fingerprint=str(raw["fingerprint"]))


if __name__ == "__main__":
    print(json.dumps(collect("--vllm" in sys.argv[1:])))
