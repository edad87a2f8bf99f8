"""The machine a run measures: GPUs, how they are linked, the host, software versions, and a fingerprint.

Sources, first that answers wins: a topology file (``--moeperf-topology``; simulates another box), NVML
(``nvidia-ml-py``), the host alone (no GPU). ``moeperf topology --json`` writes the file format read back here.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

SCHEMA = 1
#: PCIe common-ancestor levels, nearest first (as `nvidia-smi topo -m` names them).
PCIE_LEVELS = ("PIX", "PXB", "PHB", "NODE", "SYS")
LINK_KINDS = ("NVLINK",) + PCIE_LEVELS


class TopologyError(ValueError):
    """A topology file that cannot be used; the message names the file and the field."""


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    uuid: str = ""
    memory_bytes: int = 0
    compute_capability: tuple[int, int] = (0, 0)
    pcie_gen: int | None = None
    pcie_width: int | None = None
    power_limit_w: float | None = None
    max_sm_clock_mhz: int | None = None
    max_mem_clock_mhz: int | None = None
    numa_node: int | None = None
    cpu_affinity: str | None = None

    @property
    def arch(self) -> str:
        """``sm90``, ``sm120``, …"""
        major, minor = self.compute_capability
        return f"sm{major}{minor}"


@dataclass(frozen=True)
class Link:
    """How GPU ``a`` reaches GPU ``b``: ``NVLINK`` (with ``nvlinks`` lanes) or a PCIe common ancestor."""

    a: int
    b: int
    kind: str
    nvlinks: int = 0
    p2p: bool = False

    @property
    def label(self) -> str:
        return f"NV{self.nvlinks}" if self.kind == "NVLINK" else self.kind


@dataclass(frozen=True)
class Host:
    cpu_model: str
    arch: str
    cores: int
    memory_bytes: int
    #: which machine this is (`probe.host_id`: a hash of the machine id and the GPUs' UUIDs); "" when unknown
    id: str = ""
    #: how its clocks are run (CPU frequency governor, GPU persistence mode); provenance, not key
    clocks: str = ""


@dataclass(frozen=True)
class AllReduceFigure:
    """An all-reduce latency a topology file states for the box it describes (a figure carried with the file, not
    measured in this session): ``us`` per call of ``bytes`` on ``world`` ranks by ``backend``, and where it came
    from (``source``, shown wherever the figure is used)."""

    bytes: int
    us: float
    world: int
    backend: str
    source: str
    mode: str = ""


@dataclass(frozen=True)
class Fingerprint:
    """``slug`` keys the baselines directory (hardware class); ``hash`` covers the finer hardware facts; ``host``
    names the machine (runs of several hosts of one fingerprint live side by side in one baseline file), and
    ``host_facts`` say what moves performance beyond the GPU model (CPU, cores, memory, driver, clocks)."""

    slug: str
    hash: str
    facts: dict[str, Any] = field(default_factory=dict, compare=False)
    host: str = field(default="", compare=False)
    host_facts: dict[str, Any] = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class Topology:
    gpus: tuple[Gpu, ...]
    links: tuple[Link, ...]
    host: Host
    driver_version: str | None = None
    cuda_version: str | None = None
    software: dict[str, str] = field(default_factory=dict)
    source: str = "probe"
    emulation: str | None = None  # an interconnect emulation this session runs under (``emulation.py``)
    #: all-reduce latencies the file states for its box (``moeperf budget`` takes them for a target box)
    allreduce: tuple[AllReduceFigure, ...] = ()

    @property
    def simulated(self) -> bool:
        """True when read from a topology file: the devices it describes are not this machine's."""
        return self.source != "probe"

    @property
    def gpu_count(self) -> int:
        return len(self.gpus)

    @property
    def interconnect(self) -> str:
        """``nvlink`` when every GPU pair has NVLink, ``pcie`` when none has, ``mixed``, or ``none``."""
        if self.gpu_count < 2:
            return "none"
        kinds = {link.kind == "NVLINK" for link in self.links}
        if kinds == {True}:
            return "nvlink"
        if kinds == {False} or not kinds:
            return "pcie"
        return "mixed"

    @property
    def compute_capability(self) -> tuple[int, int] | None:
        """The lowest compute capability among the GPUs (None without GPUs)."""
        return min((g.compute_capability for g in self.gpus), default=None)

    def link(self, a: int, b: int) -> Link | None:
        for link in self.links:
            if {link.a, link.b} == {a, b}:
                return link
        return None

    @property
    def fingerprint(self) -> Fingerprint:
        return fingerprint(self)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("source")
        data.pop("emulation")  # a property of the session, not of the box
        if not self.allreduce:
            data.pop("allreduce")  # a probed box states none: its all-reduces are measured by the suites
        for gpu in data["gpus"]:
            gpu["compute_capability"] = list(gpu["compute_capability"])
        data["schema"] = SCHEMA
        data["fingerprint"] = {"slug": self.fingerprint.slug, "hash": self.fingerprint.hash}
        return data


# --------------------------------------------------------------------------------------------- fingerprint
_NAME_NOISE = {"nvidia", "geforce", "blackwell", "server", "workstation", "edition", "tesla"}


def short_gpu_name(name: str) -> str:
    """``NVIDIA RTX PRO 6000 Blackwell Server Edition`` → ``rtx-pro-6000``; ``NVIDIA H200`` → ``h200``."""
    words = [w for w in re.split(r"[^a-z0-9]+", name.lower()) if w and w not in _NAME_NOISE]
    return "-".join(words) or "gpu"


_CPU_NOISE = {"r", "tm", "cpu", "processor"}


def short_cpu_name(model: str) -> str:
    """``Intel(R) Xeon(R) Processor`` → ``intel-xeon``; ``AMD EPYC 9B14 96-Core Processor`` → ``amd-epyc-9b14``:
    the vendor and model words, less trademarks, core counts and the clock ("" when the model is unknown)."""
    model = re.sub(r"\d+-core|@.*$", " ", model.lower())
    return "-".join(w for w in re.split(r"[^a-z0-9]+", model) if w and w not in _CPU_NOISE)


def fingerprint(topo: Topology) -> Fingerprint:
    if topo.gpus:
        names = sorted({short_gpu_name(g.name) for g in topo.gpus})
        model = names[0] if len(names) == 1 else "mixed-" + "+".join(names)
        slug = f"{topo.gpu_count}x-{model}"
        if topo.gpu_count > 1:
            slug += f"-{topo.interconnect}"
        facts: dict[str, Any] = {
            "gpus": [
                {"name": g.name, "memory_mib": g.memory_bytes // 2**20, "cc": list(g.compute_capability),
                 "pcie": [g.pcie_gen, g.pcie_width], "power_w": g.power_limit_w,
                 "clocks": [g.max_sm_clock_mhz, g.max_mem_clock_mhz]}
                for g in topo.gpus
            ],
            "links": sorted(f"{min(x.a, x.b)}-{max(x.a, x.b)}:{x.label}:{'p2p' if x.p2p else 'nop2p'}"
                            for x in topo.links),
        }
    else:
        # the CPU's model is part of the class: one cloud image (one machine id, so one host id) has come up on an
        # Intel Xeon one day and an AMD EPYC the next, whose CPU GEMMs differ by -28..+81 % case by case
        cpu = short_cpu_name(topo.host.cpu_model)
        slug = f"cpu-{topo.host.arch}-{topo.host.cores}c" + (f"-{cpu}" if cpu else "")
        facts = {"cpu": topo.host.cpu_model, "cores": topo.host.cores,
                 "memory_gib": round(topo.host.memory_bytes / 2**30)}
    if topo.emulation:  # results under an emulation are not the box's own: they are keyed apart
        slug += f"+{topo.emulation}"
        facts["emulation"] = topo.emulation
    digest = hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:10]
    host_facts = {"cpu": topo.host.cpu_model, "cores": topo.host.cores,
                  "memory_gib": round(topo.host.memory_bytes / 2**30), "driver": topo.driver_version,
                  "clocks": topo.host.clocks}
    return Fingerprint(slug=re.sub(r"[^a-z0-9+.-]+", "-", slug.lower()), hash=digest, facts=facts,
                       host=topo.host.id, host_facts=host_facts)


# --------------------------------------------------------------------------------------------- topology file
def bundled_topologies() -> dict[str, Path]:
    """Topology files shipped with the package, by name (``8x-rtx-pro-6000-pcie``)."""
    folder = resources.files("pytest_moeperf") / "topologies"
    return {Path(entry.name).stem: Path(str(entry)) for entry in folder.iterdir() if entry.name.endswith(".json")}


def resolve_topology_path(name_or_path: Path | str) -> Path:
    path = Path(name_or_path)
    if path.exists():
        return path
    bundled = bundled_topologies()
    if str(name_or_path) in bundled:
        return bundled[str(name_or_path)]
    raise TopologyError(f"topology file {str(name_or_path)!r} not found "
                        f"(bundled names: {', '.join(sorted(bundled)) or 'none'})")


def _require(data: dict[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if key not in data:
        raise TopologyError(f"{where}: missing field {key!r}")
    value = data[key]
    if not isinstance(value, kind):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise TopologyError(f"{where}: field {key!r} must be {names}, got {type(value).__name__}")
    return value


_GPU_TYPES: dict[str, Any] = {"index": int, "uuid": str, "memory_bytes": int, "pcie_gen": (int, type(None)),
                               "pcie_width": (int, type(None)), "power_limit_w": (int, float, type(None)),
                               "max_sm_clock_mhz": (int, type(None)), "max_mem_clock_mhz": (int, type(None)),
                               "numa_node": (int, type(None)), "cpu_affinity": (str, type(None))}


def _optional(data: dict[str, Any], key: str, kind: type | tuple[type, ...], default: Any, where: str) -> Any:
    return _require(data, key, kind, where) if key in data else default


def load_topology(name_or_path: Path | str) -> Topology:
    from pytest_moeperf.store.files import FileFormatError, read_json_object

    path = resolve_topology_path(name_or_path)
    try:
        data = read_json_object(path, "topology file")
    except FileFormatError as exc:
        raise TopologyError(str(exc)) from None
    schema = data.get("schema", SCHEMA)
    if schema != SCHEMA:
        raise TopologyError(f"{path}: schema {schema} is not supported (this version reads {SCHEMA})")
    gpus: list[Gpu] = []
    for i, raw in enumerate(_require(data, "gpus", list, str(path))):
        where = f"{path}: gpus[{i}]"
        if not isinstance(raw, dict):
            raise TopologyError(f"{where}: expected an object")
        cc = _require(raw, "compute_capability", list, where)
        if len(cc) != 2 or not all(isinstance(x, int) for x in cc):
            raise TopologyError(f"{where}: compute_capability must be [major, minor]")
        known = {f for f in Gpu.__dataclass_fields__}
        unknown = set(raw) - known
        if unknown:
            raise TopologyError(f"{where}: unknown field(s) {sorted(unknown)}")
        for key, kind in _GPU_TYPES.items():
            _optional(raw, key, kind, None, where)
        gpus.append(Gpu(**{**raw, "index": raw.get("index", i), "name": _require(raw, "name", str, where),
                           "compute_capability": (cc[0], cc[1])}))
    links: list[Link] = []
    for i, raw in enumerate(_optional(data, "links", list, [], str(path))):
        where = f"{path}: links[{i}]"
        if not isinstance(raw, dict):
            raise TopologyError(f"{where}: expected an object")
        kind = _require(raw, "kind", str, where)
        if kind not in LINK_KINDS:
            raise TopologyError(f"{where}: kind {kind!r} is not one of {', '.join(LINK_KINDS)}")
        a, b = _require(raw, "a", int, where), _require(raw, "b", int, where)
        if not (0 <= a < len(gpus) and 0 <= b < len(gpus)) or a == b:
            raise TopologyError(f"{where}: a={a}, b={b} must name two different GPUs of {len(gpus)}")
        links.append(Link(a, b, kind, nvlinks=_optional(raw, "nvlinks", int, 0, where),
                          p2p=_optional(raw, "p2p", bool, False, where)))
    pairs = {frozenset((x.a, x.b)) for x in links}
    missing = [(a, b) for a in range(len(gpus)) for b in range(a + 1, len(gpus)) if frozenset((a, b)) not in pairs]
    if missing:
        raise TopologyError(f"{path}: links missing for GPU pair(s) {missing[:4]}{' …' if len(missing) > 4 else ''}")
    host_raw = _optional(data, "host", (dict, type(None)), None, str(path)) or {}
    where = f"{path}: host"
    host = Host(cpu_model=str(host_raw.get("cpu_model", "unknown")), arch=str(host_raw.get("arch", "x86_64")),
                cores=_optional(host_raw, "cores", int, 1, where),
                memory_bytes=_optional(host_raw, "memory_bytes", int, 0, where),
                id=str(host_raw.get("id", "")), clocks=str(host_raw.get("clocks", "")))
    software_raw = _optional(data, "software", (dict, type(None)), None, str(path)) or {}
    software = {str(k): str(v) for k, v in software_raw.items()}
    allreduce = tuple(_allreduce(raw, f"{path}: allreduce[{i}]")
                      for i, raw in enumerate(_optional(data, "allreduce", list, [], str(path))))
    return Topology(gpus=tuple(gpus), links=tuple(links), host=host, driver_version=data.get("driver_version"),
                    cuda_version=data.get("cuda_version"), software=software, source=str(path), allreduce=allreduce)


def _allreduce(raw: Any, where: str) -> AllReduceFigure:
    if not isinstance(raw, dict):
        raise TopologyError(f"{where}: expected an object")
    unknown = set(raw) - set(AllReduceFigure.__dataclass_fields__)
    if unknown:
        raise TopologyError(f"{where}: unknown field(s) {sorted(unknown)}")
    us = float(_require(raw, "us", (int, float), where))
    figure = AllReduceFigure(bytes=_require(raw, "bytes", int, where), us=us,
                             world=_require(raw, "world", int, where), backend=_require(raw, "backend", str, where),
                             source=_require(raw, "source", str, where), mode=_optional(raw, "mode", str, "", where))
    if figure.bytes < 1 or figure.us <= 0 or figure.world < 2:
        raise TopologyError(f"{where}: bytes >= 1, us > 0 and world >= 2 needed, got bytes={figure.bytes}, "
                            f"us={figure.us:g}, world={figure.world}")
    if not figure.source.strip():
        raise TopologyError(f"{where}: field 'source' must say where the figure came from")
    return figure


# --------------------------------------------------------------------------------------------- rendering
def render(topo: Topology) -> list[str]:
    """A table in the manner of ``nvidia-smi topo -m``, plus the GPU list and the fingerprint."""
    fp = topo.fingerprint
    lines = [f"fingerprint: {fp.slug}  (hash {fp.hash})" + (f"  [simulated from {topo.source}]" if topo.simulated
                                                            else "")]
    lines.append(f"host: {topo.host.cpu_model}, {topo.host.cores} cores, {topo.host.memory_bytes / 2**30:.0f} GiB, "
                 f"{topo.host.arch}")
    if topo.driver_version or topo.cuda_version:
        lines.append(f"driver: {topo.driver_version or '?'}  CUDA: {topo.cuda_version or '?'}")
    lines.append("software: " + ", ".join(f"{k} {v}" for k, v in sorted(topo.software.items())))
    for f in topo.allreduce:
        lines.append(f"all-reduce stated by the file: {f.us:g} us per call, {f.bytes} B on {f.world} ranks "
                     f"({f.backend}{' ' + f.mode if f.mode else ''}): {f.source}")
    if not topo.gpus:
        lines.append("GPUs: none (CPU fallback: suites run with torch on the CPU and gloo collectives)")
        return lines
    lines.append("")
    lines.append(f"{'GPU':<5}{'name':<46}{'memory':>10}{'cc':>6}{'PCIe':>9}{'power':>8}{'SM MHz':>8}  NUMA")
    for g in topo.gpus:
        pcie = f"g{g.pcie_gen}x{g.pcie_width}" if g.pcie_gen else "?"
        power = f"{g.power_limit_w:.0f}W" if g.power_limit_w else "?"
        lines.append(f"{g.index:<5}{g.name[:45]:<46}{g.memory_bytes / 2**30:>7.0f}GiB"
                     f"{'.'.join(map(str, g.compute_capability)):>6}{pcie:>9}{power:>8}"
                     f"{g.max_sm_clock_mhz or '?':>8}  {g.numa_node if g.numa_node is not None else '?'}")
    lines.append("")
    header = "      " + "".join(f"{f'GPU{g.index}':>8}" for g in topo.gpus)
    lines.append(header)
    for a in topo.gpus:
        cells = []
        for b in topo.gpus:
            link = topo.link(a.index, b.index)
            cells.append("X" if a.index == b.index else (link.label if link else "?"))
        lines.append(f"GPU{a.index:<3}" + "".join(f"{c:>8}" for c in cells))
    p2p = [f"{x.a}-{x.b}" for x in topo.links if not x.p2p]
    lines.append("")
    p2p_text = "all pairs" if not p2p else "not between " + ", ".join(p2p)
    lines.append(f"interconnect: {topo.interconnect}; P2P: {p2p_text}")
    lines.append("legend: NV# = NVLink lanes; PIX/PXB = PCIe switch(es); PHB = host bridge; NODE = same NUMA node; "
                 "SYS = across NUMA nodes")
    return lines
