"""A pinned profile at other acceptance lengths, without editing it (``--moeperf-acceptance-lengths``; pure).

Every profile whose speculative config pins its acceptance (`acceptance.pinned_length`) gains one variant per length
asked for it: a profile of its own, named ``<profile>+al<L>`` (``+``, since pytest's ``-k`` takes it and ``@``
not), the same server but for ``synthetic_acceptance_length`` L, each its own server start, its own tests and
baselines, and ``variant_of`` naming the profile (the break-even fit gathers them by it). The profile file stays
as it is, and so does the profile itself: its own length is one of the points, and a length equal to it adds no
variant. A length outside [1, k + 1] for a profile, a group for a number of speculative tokens no pinned profile
has, or no pinned profile at all, is an error naming what to change.

A variant's start keeps the compile cache warm: vLLM leaves the synthetic acceptance out of its config hash (0.32
``SpeculativeConfig.compute_hash``; measured on 1x H200 with 0.26: a start that changed only L loaded its compiled
graphs), and the project's caches are one directory per vLLM version (`lifecycle.caches`), the same for every
profile; the generated models do not depend on L either.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from pytest_moeperf.serving.models.acceptance import LENGTH_KEY, RATES_KEY, LengthGroups, length_problem
from pytest_moeperf.serving.models.profiles import ProfileError, ServeProfile

__all__ = ["OPTION", "variant_name", "with_variants"]

OPTION = "--moeperf-acceptance-lengths"


def variant_name(profile: str, length: float) -> str:
    return f"{profile}+al{length:g}"


def with_variants(profiles: Mapping[str, ServeProfile], groups: LengthGroups) -> dict[str, ServeProfile]:
    """``profiles`` with each pinned profile's variants after it (none asked: ``profiles`` as they are)."""
    if not groups:
        return dict(profiles)
    pinned = [p for p in profiles.values() if p.pinned_acceptance is not None and p.variant_of is None]
    if not pinned:
        raise ProfileError(f"{OPTION}: no serve profile pins its acceptance (a speculative config with "
                           "\"rejection_sample_method\": \"synthetic\" and \"synthetic_acceptance_length\")")
    wanted = {tokens for tokens, _ in groups}
    missing = sorted(t for t in wanted if t is not None and t not in {p.speculative_tokens for p in pinned})
    if missing:
        have = sorted({p.speculative_tokens for p in pinned})
        raise ProfileError(f"{OPTION}: no pinned profile speculates {', '.join(f'k={t}' for t in missing)} tokens "
                           f"(the pinned profiles speculate {', '.join(f'k={t}' for t in have)})")
    out: dict[str, ServeProfile] = {}
    names = {p.name for p in pinned}
    for profile in profiles.values():
        out[profile.name] = profile
        if profile.name not in names:
            continue
        for length in _lengths_for(profile, groups):
            variant = _variant(profile, length)
            if variant.name in profiles:
                raise ProfileError(f"{OPTION}: variant {variant.name!r} of {profile.name!r} is also the name of a "
                                   "profile file: rename that file")
            out[variant.name] = variant
    return out


def _lengths_for(profile: ServeProfile, groups: LengthGroups) -> list[float]:
    k = profile.speculative_tokens
    lengths: dict[float, None] = {}
    for tokens, values in groups:
        if tokens not in (None, k):
            continue
        for length in values:
            problem = length_problem(length, k)
            if problem is not None:
                raise ProfileError(f"{OPTION}: profile {profile.name!r} (k={k}): {problem}; give lengths per "
                                   f"speculative tokens (k{k}=L,L,...) for profiles of other k")
            lengths[length] = None
    own = profile.pinned_acceptance
    return [length for length in lengths if own is None or abs(length - own) > 1e-9]


def _variant(profile: ServeProfile, length: float) -> ServeProfile:
    spec = {k: v for k, v in (profile.speculative or {}).items() if k != RATES_KEY}
    spec[LENGTH_KEY] = length
    note = (f"{profile.name} at pinned acceptance length {length:g} ({OPTION}); the profile itself pins "
            f"{profile.pinned_acceptance:g}. ")
    return dataclasses.replace(profile, name=variant_name(profile.name, length), speculative=spec,
                               variant_of=profile.name, description=note + profile.description)
