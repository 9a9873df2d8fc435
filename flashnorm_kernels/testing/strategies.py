"""Hypothesis strategies for FlashNorm's dual-stream pipeline: problem shapes and sync plans.

    from flashnorm_kernels.testing import strategies as fst
    from streamcheck import strategies as sst

    @given(plan=fst.sync_plans(), shape=fst.shapes(), choice=sst.schedule_choices())
    def test_plan(plan, shape, choice): ...

Plans are drawn as the set of edges *missing* from the correct plan, so a failing
example shrinks towards the fewest missing edges, the post-scale on the caller and
the default stream kinds: the smallest plan that still fails.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from functools import lru_cache
from typing import Optional, Sequence

from hypothesis import strategies as st

from ..plan import CALLER_KINDS, EDGES, POST_STREAMS, SIDE_KINDS, SyncPlan
from .oracle import is_safe

# The pipeline's dtypes (pipeline.DTYPES; the sim emulates bfloat16), float32 first: a
# failing example shrinks to it.
DTYPES = ("float32", "float16", "bfloat16")


# --- shapes -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Shape:
    """One norm + projection problem: x is [tokens, hidden], W* is [out, hidden]."""

    tokens: int  # M: tokens per step (<= max_tokens of the pipeline)
    hidden: int  # d
    out: int  # n: output features
    dtype: str = "float32"

    def describe(self) -> str:
        return f"M={self.tokens} d={self.hidden} n={self.out} {self.dtype}"


def shapes(*, max_tokens: int = 4, max_hidden: int = 32, max_out: int = 32,
           dtypes: Sequence[str] = DTYPES) -> st.SearchStrategy[Shape]:
    """Small shapes the sim runs in microseconds; raise the bounds on a GPU."""
    for name, bound in (("max_tokens", max_tokens), ("max_hidden", max_hidden), ("max_out", max_out)):
        if not isinstance(bound, int) or bound < 1:
            raise ValueError(f"shapes({name}={bound!r}): need an integer >= 1")
    if not dtypes:
        raise ValueError("shapes(dtypes=()): name at least one dtype")
    return st.builds(
        Shape,
        tokens=st.integers(1, max_tokens),
        hidden=st.integers(1, max_hidden),
        out=st.integers(1, max_out),
        dtype=st.sampled_from(tuple(dtypes)),
    )


# --- sync plans ---------------------------------------------------------------------------


def _plan(missing: frozenset, post: str, side: str, caller: str) -> SyncPlan:
    return SyncPlan(frozenset(EDGES) - missing, post, side, caller)


def sync_plans(*, edges: Optional[Sequence[str]] = None, post_streams: Optional[Sequence[str]] = None,
               side_kinds: Optional[Sequence[str]] = None,
               caller_kinds: Optional[Sequence[str]] = None) -> st.SearchStrategy[SyncPlan]:
    """Any plan: every subset of `edges` (default: all six) may be missing, the others are
    always present; post stream and kinds default to every choice plan.py allows."""
    edges = EDGES if edges is None else tuple(edges)
    # One "left out?" flag per edge: flags shrink to False, so a failing plan shrinks to
    # the fewest missing edges (a set-valued draw shrinks less well).
    missing = st.tuples(*(st.booleans() for _ in edges)).map(
        lambda flags: frozenset(e for e, out in zip(edges, flags) if out))
    return st.builds(
        _plan,
        missing,
        st.sampled_from(tuple(post_streams or POST_STREAMS)),
        st.sampled_from(tuple(side_kinds or SIDE_KINDS)),
        st.sampled_from(tuple(caller_kinds or CALLER_KINDS)),
    )


def all_plans(*, post_streams: Optional[Sequence[str]] = None, side_kinds: Optional[Sequence[str]] = None,
              caller_kinds: Optional[Sequence[str]] = None) -> list[SyncPlan]:
    """Every plan, fewest missing edges first: 2^6 edge subsets x post streams x kinds."""
    subsets = [frozenset(c) for r in range(len(EDGES) + 1) for c in itertools.combinations(EDGES, r)]
    return [_plan(missing, post, side, caller)
            for missing in subsets
            for post in (post_streams or POST_STREAMS)
            for side in (side_kinds or SIDE_KINDS)
            for caller in (caller_kinds or CALLER_KINDS)]


@lru_cache(maxsize=1)
def _plans_by_verdict() -> tuple:
    plans = all_plans()
    return tuple(p for p in plans if is_safe(p)), tuple(p for p in plans if not is_safe(p))


def safe_plans() -> st.SearchStrategy[SyncPlan]:
    """Plans the oracle calls safe (no required ordering missing)."""
    return st.sampled_from(_plans_by_verdict()[0])


def unsafe_plans() -> st.SearchStrategy[SyncPlan]:
    """Plans the oracle calls unsafe: a race the checker must report."""
    return st.sampled_from(_plans_by_verdict()[1])
