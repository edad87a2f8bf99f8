"""Root conftest: lets a source checkout run ``pytest`` without ``pip install`` (e.g. on a GPU box with
``PYTHONPATH=.``). When the package is installed, its ``pytest11`` entry point loads the plugin instead."""

from importlib import metadata

_installed = any(ep.value == "pytest_moeperf.plugin" for ep in metadata.entry_points(group="pytest11"))
pytest_plugins = [] if _installed else ["pytest_moeperf.plugin"]
