"""The requirement markers (``gpus``, ``interconnect``, ``compute_capability``, ``arch``, ``requires``), the
``moeperf_threshold`` and ``moeperf_family`` markers, and the checks of their arguments: a marker a test cannot meet
skips it naming what was required and what was found; a marker with bad arguments is a usage error of that test (it
errors at setup), never of the whole session."""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Mapping

import pytest

from pytest_moeperf.judging.thresholds import ThresholdError, marker_values
from pytest_moeperf.machine.topology import Topology

MARKERS = (
    "gpus(n): needs at least n GPUs",
    "interconnect(kind): needs GPUs linked by 'nvlink' or 'pcie' (every pair)",
    "compute_capability(major, minor=0): needs GPUs of at least this compute capability",
    "arch(*names): needs GPUs of one of these architectures, e.g. arch('sm90', 'sm120')",
    "requires(*modules): needs these Python modules to be importable (e.g. 'vllm')",
    "moeperf_threshold(tolerance=None, abs_tolerance=None, noise_k=None): thresholds for the metrics of a test",
    "moeperf_family(*keys): the test's cases that share these context values (e.g. 'dtype', 'm') form a sub-family, "
    "which the machine views judge as a family",
    "moeperf_deadline_inside: the test checks --moeperf-deadline itself (pytest_moeperf.plugin.skip_past_deadline) "
    "before it starts new work: its result may already have been measured by another test",
    "gemm: GEMM suite",
    "allreduce: AllReduce suite",
    "serving: end-to-end serving suite",
    "specdecode: speculative-decoding suite",
)

usage_error_key = pytest.StashKey[str]()


def threshold_marker(item: pytest.Item | None) -> Mapping[str, float]:
    """The closest ``moeperf_threshold`` marker's arguments, checked (`ThresholdError` names what is wrong)."""
    marker = item.get_closest_marker("moeperf_threshold") if item is not None else None
    return {} if marker is None else marker_values(marker.args, marker.kwargs)


class MarkerError(ValueError):
    """A requirement marker with arguments it cannot take."""


class RequirementCheckError(MarkerError):
    """A ``requires`` marker whose check itself failed: the parent package of a module raised on import."""


_MODULE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


def _int(marker: pytest.Mark, value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise MarkerError(f"{marker.name}: {what} must be an integer, got {value!r}")
    try:
        number = int(value)
    except ValueError:
        raise MarkerError(f"{marker.name}: {what} must be an integer, got {value!r}") from None
    if number < 0:
        raise MarkerError(f"{marker.name}: {what} must be >= 0, got {number}")
    return number


def _module_names(marker: pytest.Mark) -> list[str]:
    if marker.kwargs or not marker.args:
        raise MarkerError(f"{marker.name}: name at least one module, as requires('vllm', ...)")
    for name in marker.args:
        if not isinstance(name, str):
            raise MarkerError(f"{marker.name}: a module name must be a string, got {name!r}")
        if not _MODULE_NAME.fullmatch(name):
            raise MarkerError(f"{marker.name}: {name!r} is not a module name")
    return list(marker.args)


def _importable(name: str) -> bool:
    """Whether module ``name`` can be found. For ``pkg.sub`` this imports ``pkg``: a missing or non-package
    parent means ``pkg.sub`` is not installed (`find_spec` raises instead of answering None)."""
    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:
        return False
    except Exception as exc:  # the parent package's own import code failed: that test's error, not the session's
        raise RequirementCheckError(f"requires({name!r}): importing its parent package raised "
                                    f"{type(exc).__name__}: {exc}") from exc


def _arg(marker: pytest.Mark, name: str, default: object = None) -> object:
    if marker.args:
        return marker.args[0]
    if name in marker.kwargs:
        return marker.kwargs[name]
    if default is None:
        raise MarkerError(f"{marker.name}: missing argument {name!r}")
    return default


def family_keys(item: pytest.Item | None) -> tuple[str, ...]:
    """The context keys the closest ``moeperf_family`` marker names (`MarkerError` for anything but names)."""
    marker = item.get_closest_marker("moeperf_family") if item is not None else None
    if marker is None:
        return ()
    if marker.kwargs or not marker.args or not all(isinstance(k, str) and k for k in marker.args):
        raise MarkerError(f"moeperf_family: name context keys, as moeperf_family('dtype', 'm'); got "
                          f"{marker.args!r} {marker.kwargs!r}")
    return tuple(marker.args)


def unmet_requirement(item: pytest.Item, topo: Topology) -> str | None:
    """Why ``item`` cannot run on ``topo`` (what was required, what was found), or None. `MarkerError` for a
    marker with bad arguments."""
    found_gpus = f"found {topo.gpu_count} GPU(s)" + (f" ({topo.gpus[0].name})" if topo.gpus else "")
    for marker in item.iter_markers("gpus"):
        need = _int(marker, _arg(marker, "n", 1), "n (the number of GPUs)")
        if topo.gpu_count < need:
            return f"requires {need} GPU(s), {found_gpus}"
    for marker in item.iter_markers("interconnect"):
        kind = str(_arg(marker, "kind")).lower()
        if kind not in {"nvlink", "pcie"}:
            raise MarkerError(f"interconnect({kind!r}) must be 'nvlink' or 'pcie'")
        if topo.interconnect != kind:
            return f"requires a {kind} interconnect, found {topo.interconnect} ({found_gpus})"
    for marker in item.iter_markers("compute_capability"):
        major = _int(marker, marker.kwargs.get("major", marker.args[0] if marker.args else None), "major")
        minor_arg = marker.args[1] if len(marker.args) > 1 else marker.kwargs.get("minor", 0)
        need_cc = (major, _int(marker, minor_arg, "minor"))
        have = topo.compute_capability
        if have is None or have < need_cc:
            have_text = "no GPU" if have is None else f"{have[0]}.{have[1]}"
            return f"requires compute capability >= {need_cc[0]}.{need_cc[1]}, found {have_text}"
    for marker in item.iter_markers("arch"):
        wanted = {str(a).lower() for a in marker.args}
        archs = {g.arch for g in topo.gpus}
        if not archs or not archs <= wanted:
            return f"requires architecture {' or '.join(sorted(wanted))}, found {', '.join(sorted(archs)) or 'no GPU'}"
    for marker in item.iter_markers("requires"):
        missing = [m for m in _module_names(marker) if not _importable(m)]
        if missing:
            return f"requires importable module(s) {', '.join(missing)}, not installed"
    return None


def apply(item: pytest.Item, topo: Topology) -> None:
    """Skip ``item`` when its requirements are unmet; remember a usage error to raise at its setup."""
    try:
        threshold_marker(item)
        family_keys(item)
        reason = unmet_requirement(item, topo)
    except RequirementCheckError as exc:
        item.stash[usage_error_key] = f"{item.nodeid}: {exc}"
        return
    except (MarkerError, ThresholdError) as exc:
        item.stash[usage_error_key] = f"{item.nodeid}: bad marker: {exc}"
        return
    if reason is not None:
        item.add_marker(pytest.mark.skip(reason=reason))


def check_usage(item: pytest.Item) -> None:
    """At setup: error the test whose markers had bad arguments."""
    message = item.stash.get(usage_error_key, None)
    if message is not None:
        pytest.fail(message, pytrace=False)
