"""Scrapes of vLLM's exposition through prometheus_client's parser: totals over engines, label selection,
escapes, special values, errors."""

from __future__ import annotations

import math

import pytest

from pytest_moeperf.serving.analysis.prometheus import PrometheusParseError, parse

VLLM_SNIPPET = """\
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="tiny-moe"} 120.0
vllm:spec_decode_num_drafts_total{engine="1",model_name="tiny-moe"} 30.0
# HELP vllm:spec_decode_num_drafts_created Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_created gauge
vllm:spec_decode_num_drafts_created{engine="0",model_name="tiny-moe"} 1.7645e+09
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="tiny-moe",position="0"} 100.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="tiny-moe",position="1"} 80.0
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="tiny-moe"} 42.0
process_open_fds 33.0 1700000000000
"""


def test_parses_vllm_exposition() -> None:
    scrape = parse(VLLM_SNIPPET)
    assert scrape.types["vllm:spec_decode_num_drafts_total"] == "counter"
    assert scrape.total("vllm:spec_decode_num_drafts_total") == 150.0
    assert scrape.total("vllm:spec_decode_num_drafts_total", engine="1") == 30.0
    assert scrape.total("vllm:nonexistent_total") is None
    pos = scrape.select("vllm:spec_decode_num_accepted_tokens_per_pos_total", position="1")
    assert len(pos) == 1 and pos[0].value == 80.0
    bucket = scrape.select("vllm:time_to_first_token_seconds_bucket")[0]
    assert bucket.label_map["le"] == "+Inf"
    assert scrape.total("process_open_fds") == 33.0  # timestamp ignored
    assert "vllm:spec_decode_num_drafts_created" in scrape.names()


def test_escapes_special_values_and_spacing() -> None:
    text = 'm{a="x\\"y",b="line\\nbreak",c="back\\\\slash", } NaN\nn +Inf\no{} -Inf\n'
    scrape = parse(text)
    m = scrape.select("m")[0]
    assert m.label_map == {"a": 'x"y', "b": "line\nbreak", "c": "back\\slash"}
    assert math.isnan(m.value)
    assert scrape.total("n") == math.inf and scrape.total("o") == -math.inf


def test_label_with_braces_and_commas_in_value() -> None:
    scrape = parse('m{path="/v1/{x},y"} 2\n')
    assert scrape.select("m", path="/v1/{x},y")[0].value == 2.0


@pytest.mark.parametrize("bad", ['m{a="x} 1', "m notanumber", "m"])
def test_errors_are_ours_and_say_what_failed(bad: str) -> None:
    with pytest.raises(PrometheusParseError, match="unparsable Prometheus exposition"):
        parse("ok 1\n" + bad + "\n")
