"""Which sync plans are safe: an oracle for the dual-stream pipeline, independent of streamcheck's
happens-before checker (streamcheck/core/hb.py).

It models the decode loop that `streamcheck fuzz` and the plan fuzz tests run
(flashnorm_kernels/commands/fuzz.py, `run_program`), as issued by the host:

    once:      upload W on A                                   (the pipeline's weight upload)
    each step: upload x_t on the caller's stream
               [war] A and B (unless post-scale runs there) wait on `war`, from step 1 on
               [fork_a] caller -> A, [fork_b] caller -> B
               matmul on A (reads x_t, W; writes Y), rms on B (reads x_t; writes r)
               [join_mm] A -> post, [join_rms] B -> post      (no event within one stream)
               postscale on post (reads Y, r; writes out)
               [join_back] post -> caller;  [war] record `war` on post
               host: caller.synchronize(), then reads out

and decides safety by plain graph reachability over those operations: an edge for
each rule CUDA promises (docs/cuda-rules.md), none for anything else, and a plan is unsafe
iff two accesses to one buffer, at least one a write, have no path between them.
No vector clocks and no trace: a second, independent derivation to hold the
checker's verdict against.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from ..plan import SyncPlan

HOST = "host"
# Stream kinds that synchronize with the legacy default stream (per-thread default
# streams behave like blocking ones; non-blocking streams never do).
_JOINS_LEGACY = ("blocking", "per_thread")


@dataclass(frozen=True)
class Node:
    """One operation of the modelled program, in host issue order."""

    index: int
    actor: str  # "caller", "A", "B", or HOST
    what: str  # "matmul", "record join_mm", "sync caller", ...
    step: int  # -1: set-up
    reads: frozenset = frozenset()
    writes: frozenset = frozenset()

    def __str__(self) -> str:
        when = "set-up" if self.step < 0 else f"step {self.step}"
        return f"{self.what} on {self.actor} ({when})"


@dataclass(frozen=True)
class Hazard:
    """Two conflicting accesses with no happens-before path between them."""

    kind: str  # RAW, WAR or WAW
    buffer: str  # "x", "W", "Y", "r" or "out"
    first: Node
    second: Node

    def describe(self) -> str:
        return f"{self.kind} on {self.buffer}: {self.first} unordered with {self.second}"


def _streams(plan: SyncPlan) -> dict:
    """Actor -> stream kind; the post-scale runs on one of the three streams."""
    return {"caller": plan.caller_kind, "A": plan.side_kind, "B": plan.side_kind}


def program(plan: SyncPlan, steps: int = 2) -> list:
    """The decode loop's operations for `plan`, in issue order (see the module docstring)."""
    nodes: list[Node] = []

    def op(actor, what, step, reads=(), writes=()):
        nodes.append(Node(len(nodes), actor, what, step, frozenset(reads), frozenset(writes)))

    def edge(name, src, dst, step):
        if name in plan.edges and src != dst:  # within one stream, issue order is the edge
            op(src, f"record {name}", step)
            op(dst, f"wait {name}", step)

    post = plan.post_stream
    op("A", "upload W", -1, writes=["W"])
    for t in range(steps):
        x = f"x{t}"  # each step's input has its own rows
        op("caller", "upload x", t, writes=[x])
        if "war" in plan.edges and t > 0:
            for side in ("A", "B"):
                if side != post:
                    op(side, "wait war", t)
        edge("fork_a", "caller", "A", t)
        edge("fork_b", "caller", "B", t)
        op("A", "matmul", t, reads=[x, "W"], writes=["Y"])
        op("B", "rms", t, reads=[x], writes=["r"])
        edge("join_mm", "A", post, t)
        edge("join_rms", "B", post, t)
        op(post, "postscale", t, reads=["Y", "r"], writes=["out"])
        edge("join_back", post, "caller", t)
        if "war" in plan.edges:
            op(post, "record war", t)
        op(HOST, "sync caller", t)
        op(HOST, "read out", t, reads=["out"])
    return nodes


def predecessors(plan: SyncPlan, nodes: list) -> list:
    """For each node, the nodes CUDA orders directly before it."""
    kinds = _streams(plan)
    last_on: dict[str, int] = {}  # actor -> last node issued there
    last_record: dict[str, int] = {}  # event -> its latest record node (a record replaces the earlier one)
    last_host = None
    preds: list[set] = []
    for node in nodes:
        p: set = set()
        if node.actor == HOST:
            if last_host is not None:
                p.add(last_host)  # host program order
            if node.what.startswith("sync "):
                stream = node.what.split()[1]
                if stream in last_on:
                    p.add(last_on[stream])  # synchronize: the host waits for the stream's work so far
                if kinds.get(stream) == "legacy":  # and, for the legacy stream, blocking streams' (measured)
                    p.update(last_on[s] for s, k in kinds.items() if k in _JOINS_LEGACY and s in last_on)
            last_host = node.index
        else:
            actor, kind = node.actor, kinds[node.actor]
            if actor in last_on:
                p.add(last_on[actor])  # one stream runs in issue order
            if last_host is not None:
                p.add(last_host)  # issued work comes after what the host did before issuing it
            if kind == "legacy":
                # Legacy stream work waits for all earlier work on blocking streams.
                p.update(last_on[s] for s, k in kinds.items() if k in _JOINS_LEGACY and s in last_on)
            elif kind in _JOINS_LEGACY:
                # ... and blocking-stream work waits for earlier legacy work.
                p.update(last_on[s] for s, k in kinds.items() if k == "legacy" and s in last_on)
            if node.what.startswith("wait "):
                event = node.what.split()[1]
                if event in last_record:
                    p.add(last_record[event])  # the record current at the wait call; none: a no-op
            elif node.what.startswith("record "):
                last_record[node.what.split()[1]] = node.index
            last_on[actor] = node.index
        preds.append(p)
    return preds


def ancestors(plan: SyncPlan, nodes: list) -> list:
    """Bitmask per node of everything that happens before it (transitive closure)."""
    before: list[int] = []
    for p in predecessors(plan, nodes):
        mask = 0
        for i in p:
            mask |= before[i] | (1 << i)
        before.append(mask)
    return before


def _kind(first: Node, second: Node, buffer: str) -> str:
    if buffer in first.writes and buffer in second.writes:
        return "WAW"
    return "RAW" if buffer in first.writes else "WAR"


@lru_cache(maxsize=None)
def hazards(plan: SyncPlan, steps: int = 2) -> tuple:
    """Every unordered conflicting pair of the plan's decode loop over `steps` steps.
    Two steps show every hazard: step t+1 meets step t exactly as step 1 meets step 0
    (the `war` wait begins at step 1), and nothing reaches past the step before."""
    nodes = program(plan, steps)
    before = ancestors(plan, nodes)
    found = []
    for j, second in enumerate(nodes):
        for first in nodes[:j]:
            if before[j] >> first.index & 1:
                continue
            for buffer in sorted((first.writes & (second.reads | second.writes)) | (first.reads & second.writes)):
                found.append(Hazard(_kind(first, second, buffer), buffer, first, second))
    return tuple(found)


def is_safe(plan: SyncPlan) -> bool:
    """True iff every required ordering of the decode loop is present."""
    return not hazards(plan)


def racy_buffers(plan: SyncPlan) -> frozenset:
    """The buffers on which `plan` leaves two accesses unordered."""
    return frozenset(h.buffer.rstrip("0123456789") for h in hazards(plan))
