"""Settings: the ``--moeperf-*`` option table with its ini twins (`options`) and the argument checks it shares
with the ``moeperf`` command (`checks`)."""

from pytest_moeperf.settings.checks import parse_server_urls
from pytest_moeperf.settings.options import (
    DEADLINE_ENV,
    GPU_STARTS,
    OPTIONS,
    ROUND_ENV,
    WINDOWS_ENV,
    Option,
    Settings,
    add_options,
    quiet_floor_of,
    resolve,
    starts_of,
)

__all__ = ["DEADLINE_ENV", "GPU_STARTS", "OPTIONS", "ROUND_ENV", "WINDOWS_ENV", "Option", "Settings", "add_options",
           "parse_server_urls", "quiet_floor_of", "resolve", "starts_of"]
