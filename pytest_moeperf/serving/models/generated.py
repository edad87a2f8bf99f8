"""The models the project generates, by the name a profile gives them: each name → the directory to serve, written
on first use and cached by the hash of what goes into it (``tinymodel``, ``kimirank``, ``kimieagle3``). None has
weights: a profile that serves one runs it with ``--load-format dummy``."""

from __future__ import annotations

from pathlib import Path

from pytest_moeperf.serving.models.profiles import (
    KIMI_RANK,
    KIMI_RANK_EAGLE3,
    KIMI_RANK_MTP,
    KIMI_SHAPED,
    TINY_DRAFT,
    TINY_EAGLE3,
    TINY_MOE,
)

__all__ = ["generated_dirs"]


def generated_dirs(cache_root: Path, target: str) -> dict[str, str]:
    """The directories a profile serving the generated model ``target`` needs: the target's, and for the tiny MoE
    its draft model and EAGLE-3 head, for the Kimi rank its EAGLE-3 head (a speculative config may name them)."""
    if target == KIMI_RANK:  # with its EAGLE-3 head (a speculative config may name it)
        from pytest_moeperf.serving.models.kimieagle3 import ensure_kimi_eagle3_head
        from pytest_moeperf.serving.models.kimirank import ensure_kimi_rank_model

        return {target: str(ensure_kimi_rank_model(cache_root)),
                KIMI_RANK_EAGLE3: str(ensure_kimi_eagle3_head(cache_root))}
    if target == KIMI_RANK_MTP:
        from pytest_moeperf.serving.models.kimirank import KimiRankSpec, ensure_kimi_rank_model

        return {target: str(ensure_kimi_rank_model(cache_root, KimiRankSpec().with_mtp()))}
    from pytest_moeperf.serving.models.tinymodel import (
        ensure_tiny_eagle3,
        ensure_tiny_model,
        kimi_rank_shaped_spec,
        tiny_draft_spec,
    )

    if target in KIMI_SHAPED:
        return {target: str(ensure_tiny_model(cache_root, kimi_rank_shaped_spec(KIMI_SHAPED[target])))}
    return {
        TINY_MOE: str(ensure_tiny_model(cache_root)),
        TINY_DRAFT: str(ensure_tiny_model(cache_root, tiny_draft_spec())),
        TINY_EAGLE3: str(ensure_tiny_eagle3(cache_root)),
    }
