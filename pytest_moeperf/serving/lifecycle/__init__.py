"""Server lifecycle: launch, attach, ports, the pool, a served profile and its windows; imports the parts below it
(:mod:`~pytest_moeperf.serving.models`, :mod:`~pytest_moeperf.serving.analysis`, :mod:`~pytest_moeperf.serving.load`),
never the wiring above it."""
