"""Sync plans for the dual-stream deferred-normalization pipeline.

    caller ──fork_a──► A: Y = x·W*ᵀ ──join_mm──┐
           └─fork_b──► B: r = 1/RMS(x) ─join_rms─┴─► post-scale: out = Y·r ──join_back──► caller

plus `war`: step t+1's matmul (stream A) and RMS (stream B) wait until step t's
post-scale has read Y and r (those buffers are persistent, as inference engines
preallocate them). The caller's own ordering (join_back, then next step's forks)
covers the same hazard; `war` is what keeps it closed when the caller does not wait.

Each edge is an event recorded on the source stream and waited on by the target.
A plan names the edges present, the stream that runs the post-scale, and the
stream kinds. The talk's bug is `SyncPlan.implicit_join()`: no join_mm.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

EDGES = ("fork_a", "fork_b", "join_mm", "join_rms", "join_back", "war")
POST_STREAMS = ("caller", "A", "B")
SIDE_KINDS = ("non_blocking", "blocking")
CALLER_KINDS = ("legacy", "non_blocking", "blocking")


@dataclass(frozen=True)
class SyncPlan:
    edges: frozenset = field(default_factory=lambda: frozenset(EDGES))
    post_stream: str = "caller"
    side_kind: str = "non_blocking"  # kind of streams A and B
    caller_kind: str = "legacy"  # the caller's stream: the legacy default stream or a user stream

    def __post_init__(self):
        edges = frozenset(self.edges)
        unknown = edges - set(EDGES)
        if unknown:
            raise ValueError(f"SyncPlan: unknown edges {sorted(unknown)}; edges are {', '.join(EDGES)}")
        object.__setattr__(self, "edges", edges)
        if self.post_stream not in POST_STREAMS:
            raise ValueError(f"SyncPlan: post_stream {self.post_stream!r} must be one of {POST_STREAMS}")
        if self.side_kind not in SIDE_KINDS:
            raise ValueError(f"SyncPlan: side_kind {self.side_kind!r} must be one of {SIDE_KINDS}")
        if self.caller_kind not in CALLER_KINDS:
            raise ValueError(f"SyncPlan: caller_kind {self.caller_kind!r} must be one of {CALLER_KINDS}")

    @classmethod
    def correct(cls, **kinds) -> "SyncPlan":
        """Every edge: safe under any schedule."""
        return cls(frozenset(EDGES), **kinds)

    @classmethod
    def implicit_join(cls, **kinds) -> "SyncPlan":
        """The talk's bug: the post-scale never waits for the matmul's completion."""
        return cls(frozenset(EDGES) - {"join_mm"}, **kinds)

    def has(self, edge: str) -> bool:
        return edge in self.edges

    def without(self, *edges: str) -> "SyncPlan":
        return replace(self, edges=self.edges - set(edges))

    def describe(self) -> str:
        missing = [e for e in EDGES if e not in self.edges]
        return (f"SyncPlan(post on {self.post_stream}, side streams {self.side_kind}, caller {self.caller_kind}, "
                f"missing: {', '.join(missing) or 'none'})")
