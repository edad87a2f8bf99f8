"""Window analysis: metrics, drift, tails, the server's own figures, spec-decode acceptance, kernel compiles; imports
only :mod:`~pytest_moeperf.serving.models` of the serving parts."""
