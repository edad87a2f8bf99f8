"""CUDA graphs for the decode batches a profile's windows run, and no others.

vLLM captures a CUDA graph per batch size in tokens at start-up: by default 1, 2, 4, then every multiple of 8 up to
``min(2 x max_num_seqs x (1 + speculative tokens), 512)`` (51 sizes, 9 s on an H200 for a 3-token speculating
profile with ``--max-num-seqs 64``). A decode step of ``n`` sequences is ``n x (1 + speculative tokens)`` tokens;
a step runs the graph of the next captured size up (padded), or none above the largest. A profile's
``cudagraph_batches`` lists the sequences per decode step it captures graphs for; the launcher passes
``--cudagraph-capture-sizes`` in tokens (:func:`capture_sizes`). The suites' closed-loop concurrencies must be
among them, so that a window's target batch is never padded (``tests/serving/test_capture_sizes.py`` checks the
committed GPU profiles against the suites' workloads); the powers of two between them bound the padding of a
window's ramp-up and drain to 2x.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

__all__ = ["GRAPH_FLAGS", "capture_args", "capture_sizes", "conflicting_flags", "decode_tokens",
           "default_capture_sizes"]

#: vLLM options that also decide the captured sizes (or that there are none): a profile that sets them and
#: ``cudagraph_batches`` says two things at once
GRAPH_FLAGS = ("--cudagraph-capture-sizes", "--max-cudagraph-capture-size", "--enforce-eager")
#: vLLM's compilation config on the command line (``-cc.cudagraph_capture_sizes=...`` too): it may name sizes
_COMPILATION_FLAGS = ("-cc", "--compilation-config")


def decode_tokens(sequences: int, speculative_tokens: int) -> int:
    """Tokens in one decode step of ``sequences`` sequences, each verifying ``speculative_tokens`` drafts."""
    return sequences * (1 + speculative_tokens)


def capture_sizes(batches: Iterable[int], speculative_tokens: int) -> tuple[int, ...]:
    """The CUDA-graph capture sizes (tokens) of decode steps of ``batches`` sequences, ascending."""
    return tuple(sorted({decode_tokens(b, speculative_tokens) for b in batches}))


def default_capture_sizes(max_num_seqs: int, speculative_tokens: int) -> tuple[int, ...]:
    """vLLM 0.26's own list (``VllmConfig._set_cudagraph_sizes``; a speculating profile's sizes rounded up to
    multiples of ``1 + speculative_tokens``, ``adjust_cudagraph_sizes_for_spec_decode``), for
    ``max_num_batched_tokens`` >= 512: what a profile without ``cudagraph_batches`` captures."""
    query = 1 + speculative_tokens
    largest = min(max_num_seqs * query * 2, 512)
    sizes = [s for s in (1, 2, 4) if s <= largest] + list(range(8, min(largest + 1, 256), 8))
    sizes += list(range(256, largest + 1, 16))
    if query > 1:
        sizes = [-(-s // query) * query for s in sizes]
        sizes = [s for s in sizes if s <= largest]
    return tuple(sorted(set(sizes)))


def capture_args(batches: Sequence[int], speculative_tokens: int) -> list[str]:
    """vLLM's arguments that capture exactly the graphs of ``batches``."""
    return ["--cudagraph-capture-sizes", *map(str, capture_sizes(batches, speculative_tokens))]


def conflicting_flags(vllm_args: Sequence[str]) -> list[str]:
    """The arguments among ``vllm_args`` that decide the captured sizes too (``--enforce-eager`` captures none; a
    compilation config that names capture sizes), as written."""
    found = []
    for i, arg in enumerate(vllm_args):
        flag, _, inline = arg.partition("=")
        if flag in GRAPH_FLAGS or (flag.startswith("-cc.") and "cudagraph_capture_size" in flag):
            found.append(arg)
        elif flag in _COMPILATION_FLAGS:
            value = inline or (vllm_args[i + 1] if i + 1 < len(vllm_args) else "")
            if "cudagraph_capture_size" in value:
                found.append(arg if inline else f"{arg} {value}")
    return found
