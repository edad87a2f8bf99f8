"""Load generation: the streaming client, the requests a window sends, the warm pass before it; imports only the
parts below it (:mod:`~pytest_moeperf.serving.models`, :mod:`~pytest_moeperf.serving.analysis`)."""
