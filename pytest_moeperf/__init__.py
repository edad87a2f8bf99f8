"""pytest-moeperf: performance regression tests for serving large MoE models."""

from pytest_moeperf.perf import Perf
from pytest_moeperf.records import Measurement, Section
from pytest_moeperf.topology import Fingerprint, Gpu, Host, Link, Topology

__all__ = ["Fingerprint", "Gpu", "Host", "Link", "Measurement", "Perf", "Section", "Topology"]
__version__ = "0.1.0"
