"""pytest-moeperf: performance regression tests for serving large MoE models."""

from pytest_moeperf.ledger import Measurement, Section
from pytest_moeperf.machine.topology import Fingerprint, Gpu, Host, Link, Topology
from pytest_moeperf.perf import Perf

__all__ = ["Fingerprint", "Gpu", "Host", "Link", "Measurement", "Perf", "Section", "Topology"]
__version__ = "0.1.0"
