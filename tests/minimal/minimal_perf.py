"""A perf test that needs nothing but pytest and the plugin (copied and run by check_base_install.py)."""


def test_records_a_metric(perf):
    samples = [float(sum(range(1000 + i))) for i in range(5)]  # deterministic numbers: the machinery is tested
    perf.context(kind="synthetic")
    perf.record("work", samples, unit="count", better="lower")
