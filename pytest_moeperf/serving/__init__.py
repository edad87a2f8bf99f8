"""End-to-end serving: tiny model, serve profiles, server launch/attach, load generator, metrics, spec decode.

Four parts, each importing only the parts below it (``tests/serving/test_layers.py`` checks every import, local ones
included):

1. :mod:`~pytest_moeperf.serving.models`: serve profiles as data, and the models the project generates;
2. :mod:`~pytest_moeperf.serving.analysis`: what a window measured: metrics, drift, tails, the server's own figures
   (Prometheus scrapes, the arbiter, spec-decode acceptance) and the kernel compiles it met;
3. :mod:`~pytest_moeperf.serving.load`: load generation: the client, the prompts, the warm pass before a window;
4. :mod:`~pytest_moeperf.serving.lifecycle`: servers: launch, attach, ports, the pool, a served profile's windows.

On top, in this package itself, the wiring that may import any part: the pytest surface (``plugin``), what a
window records (``recording``), how a speedup is measured (``speedup``), ``moeperf serve`` (``cli``) and
``python -m pytest_moeperf.serving.crosscheck``.
"""
