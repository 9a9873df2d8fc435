"""The checker against an executable oracle on random small stream programs.

The oracle is written from the CUDA rules of docs/cuda-rules.md, independently of hb.py: it turns a
program into a DAG of "must execute before" constraints, then runs the program in
every order the DAG allows (every linear extension, memoized on the set of operations
done and the memory contents), on real values: each write stores
a value no other write stores. A program is *value-racy* when two allowed orders give
different reads or different final memory.

What is asserted, for every generated program:
1. checker reports a race  <=>  the oracle's DAG leaves some conflicting pair unordered
   (two accesses to a common byte, at least one a write): the checker is exact, neither
   missing an unordered pair nor flagging an ordered one;
2. every reported race names a pair the DAG leaves unordered, with a kind (RAW/WAR/WAW)
   that pair has, and the set of operations named as `second` is exactly the set of
   operations that have an unordered conflicting predecessor;
3. value-racy  =>  the checker reports a race (and the oracle agrees with itself: a
   value-racy program has an unordered conflicting pair).
The converse of 3 does not hold: two unordered accesses may still give equal values in
every order (e.g. a write whose value is overwritten before anyone reads it and before
the end), so value-racy is a subset of checker-racy.

Half the programs span two devices: each stream belongs to cuda:0 or cuda:1, each device may
have its own legacy stream, a device synchronize waits for one device, events cross devices
(peer access is enabled both ways, so every kernel may touch every buffer).
"""
from __future__ import annotations

from functools import lru_cache, partial

from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from flashnorm_kernels.commands.fuzz import run_program
from flashnorm_kernels.testing.strategies import Shape, unsafe_plans
from streamcheck.proofs.confirm import confirm_races
from streamcheck.core.hb import check, format_report
from streamcheck.core.trace import (Alloc, CallSite, DeviceSync, EventCreate, EventRecord, EventSync, HostAccess, Launch,
                               PeerAccess, Range, StreamCreate, StreamKind, StreamSync, StreamWait, Trace)

CELL = 4  # bytes per cell; every buffer has two cells
RANGES = {"lo": (0,), "hi": (1,), "all": (0, 1)}  # name -> cells covered
N_EVENTS = 2
MAX_OPS = 12
STATE_CAP = 200_000  # oracle search states per program
PROGRAM_FILE = "oracle_program.py"


def _examples(floor: int = 300) -> int:
    """The loaded hypothesis profile's max_examples, but at least `floor`: an example costs
    milliseconds here, far less than the simulated-schedule tests the `streamcheck-ci` profile is sized for."""
    return max(floor, settings.default.max_examples)


# --- programs -----------------------------------------------------------------------------
# A program: (kinds, n_buffers, ops[, devices]). Streams are 0..len(kinds)-1, on devices[s]
# (all on device 0 without it), events 1..N_EVENTS, buffers 0..n_buffers-1. Operations are tuples:
#   ("launch", stream, reads, writes)   reads/writes: tuples of (buffer, range name)
#   ("record", event, stream)  ("wait", stream, event)
#   ("ssync", stream)  ("esync", event)  ("dsync",) or ("dsync", device)
#   ("hread", (buffer, range))  ("hwrite", (buffer, range))

OP_KINDS = ["launch", "record", "wait", "ssync", "esync", "dsync", "hread", "hwrite"]
OP_WEIGHTS = ["launch"] * 4 + ["record"] * 2 + ["wait"] * 2 + OP_KINDS[3:]


@st.composite
def programs(draw):
    n_streams = draw(st.integers(2, 3))
    kinds = [draw(st.sampled_from([StreamKind.BLOCKING, StreamKind.NON_BLOCKING])) for _ in range(n_streams)]
    two = draw(st.booleans())
    devices = [0] + [draw(st.integers(0, 1)) if two else 0 for _ in range(n_streams - 1)]
    if draw(st.booleans()):
        kinds[0] = StreamKind.LEGACY
    if two and 1 in devices and draw(st.booleans()):  # cuda:1's own legacy stream
        kinds[devices.index(1)] = StreamKind.LEGACY
    if draw(st.integers(0, 3)) == 0:  # at most one per-thread default stream (one host thread)
        kinds[-1] = StreamKind.PER_THREAD
    n_buffers = draw(st.integers(2, 3))
    stream = st.integers(0, n_streams - 1)
    ev = st.integers(1, N_EVENTS)
    access = st.tuples(st.integers(0, n_buffers - 1), st.sampled_from(["all", "all", "lo", "hi"]))
    # Swarm testing: each program uses a random subset of the operation kinds, so rare
    # combinations (say, only launches and stream syncs) are not drowned by the rest.
    enabled = draw(st.sets(st.sampled_from(OP_KINDS), min_size=1)) | {"launch"}
    weights = [tag for tag in OP_WEIGHTS if tag in enabled]
    ops = []
    for _ in range(draw(st.integers(1, MAX_OPS))):
        tag = draw(st.sampled_from(weights))
        if tag == "launch":
            reads = tuple(draw(st.lists(access, max_size=1)))
            writes = tuple(draw(st.lists(access, min_size=0 if reads else 1, max_size=1)))
            ops.append((tag, draw(stream), reads, writes))
        elif tag == "record":
            ops.append((tag, draw(ev), draw(stream)))
        elif tag == "wait":
            ops.append((tag, draw(stream), draw(ev)))
        elif tag == "ssync":
            ops.append((tag, draw(stream)))
        elif tag == "esync":
            ops.append((tag, draw(ev)))
        elif tag == "dsync":
            ops.append((tag, draw(st.integers(0, max(devices)))))
        else:
            ops.append((tag, draw(access)))
    if not two:
        return tuple(kinds), n_buffers, tuple(ops)
    return tuple(kinds), n_buffers, tuple(ops), tuple(devices)


def accesses(op) -> list:
    """(buffer, cells, is_write) for each memory access of `op`."""
    tag = op[0]
    if tag == "launch":
        return ([(b, RANGES[r], False) for b, r in op[2]] + [(b, RANGES[r], True) for b, r in op[3]])
    if tag == "hread":
        return [(op[1][0], RANGES[op[1][1]], False)]
    if tag == "hwrite":
        return [(op[1][0], RANGES[op[1][1]], True)]
    return []


# --- the oracle ---------------------------------------------------------------------------

def must_happen_before(kinds, ops, devices=None) -> list[set]:
    """preds[i]: the operations that CUDA guarantees finish before operation i starts.
    Every edge goes from an earlier-issued operation to a later one."""
    devices = devices or (0,) * len(kinds)
    legacy_of = {devices[s]: s for s, k in enumerate(kinds) if k is StreamKind.LEGACY}
    # Blocking and per-thread default streams synchronize with their device's legacy stream both ways.
    joiners = [s for s, k in enumerate(kinds) if k in (StreamKind.BLOCKING, StreamKind.PER_THREAD)]
    last_on = {}  # stream -> its last issued operation
    recorded = {}  # event -> its current record operation (a re-record replaces it)
    last_host = None  # the host's last blocking action: issue happens after it returns
    preds = []
    for i, op in enumerate(ops):
        tag, before = op[0], set()
        if last_host is not None:
            before.add(last_host)
        if tag in ("launch", "record", "wait"):
            s = op[1] if tag != "record" else op[2]
            if s in last_on:
                before.add(last_on[s])  # stream order
            legacy = legacy_of.get(devices[s])
            if s == legacy:
                before |= {last_on[t] for t in joiners if t in last_on and devices[t] == devices[s]}
            elif s in joiners and legacy in last_on:
                before.add(last_on[legacy])
            if tag == "record":
                recorded[op[1]] = i
            if tag == "wait" and op[2] in recorded:  # the record as it is *now*; none: no-op
                before.add(recorded[op[2]])
            last_on[s] = i
        else:  # host actions: syncs, host reads and writes
            if tag == "ssync" and op[1] in last_on:
                before.add(last_on[op[1]])
            if tag == "ssync" and op[1] == legacy_of.get(devices[op[1]]):  # and its device's blocking streams
                before |= {last_on[t] for t in joiners if t in last_on and devices[t] == devices[op[1]]}
            elif tag == "esync" and op[1] in recorded:
                before.add(recorded[op[1]])
            elif tag == "dsync":  # that device's streams only
                device = op[1] if len(op) > 1 else 0
                before |= {last for t, last in last_on.items() if devices[t] == device}
            last_host = i
        preds.append(before)
    return preds


def ancestors(preds) -> list[int]:
    """Transitive closure: bit j of result[i] is set iff j must happen before i."""
    anc = []
    for before in preds:
        mask = 0
        for p in before:
            mask |= anc[p] | (1 << p)
        anc.append(mask)
    return anc


def unordered_conflicts(ops, anc) -> dict:
    """(i, j) with i issued before j, conflicting and not ordered -> the race kinds they form."""
    out = {}
    for j, later in enumerate(ops):
        for i in range(j):
            if anc[j] >> i & 1:
                continue
            kinds = set()
            for b1, cells1, w1 in accesses(ops[i]):
                for b2, cells2, w2 in accesses(later):
                    if b1 == b2 and set(cells1) & set(cells2) and (w1 or w2):
                        kinds.add("WAW" if w1 and w2 else "RAW" if w1 else "WAR")
            if kinds:
                out[(i, j)] = kinds
    return out


class ValueRace(Exception):
    """Two allowed execution orders gave different reads or final memory."""


def value_racy(n_buffers, ops, preds) -> bool:
    """Run every allowed order on real values. Memoized on (operations done, memory):
    if any reachable state has two continuations with different outcomes, two complete
    orders (sharing that prefix) differ, so the search stops there."""
    n = len(ops)
    pred_mask = [sum(1 << p for p in before) for before in preds]
    full = (1 << n) - 1

    def run(i, memory):
        memory = list(memory)
        reads = tuple(memory[b * 2 + c] for b, cells, w in accesses(ops[i]) if not w for c in cells)
        for b, cells, w in accesses(ops[i]):
            if w:
                for c in cells:
                    memory[b * 2 + c] = ("written by", i)  # every write stores a distinct value
        return reads, tuple(memory)

    @lru_cache(maxsize=None)
    def outcome(done: int, memory: tuple) -> tuple:
        """(reads of each not-yet-done operation, final memory), the same for every allowed order."""
        # At most 2**MAX_OPS sets of done operations, each with few memories: a cap that
        # only a generator change could hit, and then loudly rather than slowly.
        assert outcome.cache_info().currsize < STATE_CAP, f"oracle state space over {STATE_CAP}: {ops}"
        if done == full:
            return (None,) * n, memory
        seen = None
        for i in range(n):
            if not done >> i & 1 and pred_mask[i] & ~done == 0:
                reads, after = run(i, memory)
                rest_reads, final = outcome(done | 1 << i, after)
                this = (rest_reads[:i] + (reads,) + rest_reads[i + 1:], final)
                if seen is None:
                    seen = this
                elif this != seen:
                    raise ValueRace
        return seen

    initial = tuple(("initial", b, c) for b in range(n_buffers) for c in range(2))
    try:
        outcome(0, initial)
    except ValueRace:
        return True
    return False


# --- the program as a trace ---------------------------------------------------------------

def to_trace(kinds, n_buffers, ops, devices=None) -> Trace:
    """Operation i gets call site oracle_program.py:<i + 1>; setup lines are 0."""
    setup = CallSite(PROGRAM_FILE, 0)
    trace = Trace()
    devices = devices or (0,) * len(kinds)
    for s, kind in enumerate(kinds):
        trace.append(StreamCreate(0, setup, stream=s, kind=kind, name=f"S{s}", device=devices[s]))
    if max(devices) > 0:  # every kernel may touch every buffer (all on cuda:0)
        trace.append(PeerAccess(0, setup, device=1, peer=0))
    for e in range(1, N_EVENTS + 1):
        trace.append(EventCreate(0, setup, event=e, name=f"e{e}"))
    for b in range(n_buffers):
        trace.append(Alloc(0, setup, buffer=b, nbytes=2 * CELL, name=f"buf{b}"))

    def rng(access):
        b, r = access
        cells = RANGES[r]
        return Range(b, cells[0] * CELL, (cells[-1] + 1) * CELL)

    for i, op in enumerate(ops):
        site, tag = CallSite(PROGRAM_FILE, i + 1), op[0]
        if tag == "launch":
            trace.append(Launch(0, site, stream=op[1], name=f"k{i}", reads=tuple(map(rng, op[2])),
                                writes=tuple(map(rng, op[3]))))
        elif tag == "record":
            trace.append(EventRecord(0, site, event=op[1], stream=op[2]))
        elif tag == "wait":
            trace.append(StreamWait(0, site, stream=op[1], event=op[2]))
        elif tag == "ssync":
            trace.append(StreamSync(0, site, stream=op[1]))
        elif tag == "esync":
            trace.append(EventSync(0, site, event=op[1]))
        elif tag == "dsync":
            trace.append(DeviceSync(0, site, device=op[1] if len(op) > 1 else 0))
        elif tag == "hread":
            trace.append(HostAccess(0, site, reads=(rng(op[1]),), name=f"h{i}"))
        else:
            trace.append(HostAccess(0, site, writes=(rng(op[1]),), name=f"h{i}"))
    return trace


# --- the property ---------------------------------------------------------------------------
NB, B, L = StreamKind.NON_BLOCKING, StreamKind.BLOCKING, StreamKind.LEGACY
# The talk's bug: matmul on A, post-scale on B reads its output with no join. Then the fix.
TALK_BUG = ((NB, NB), 2, (("launch", 0, (), ((0, "all"),)), ("launch", 1, ((0, "all"),), ((1, "all"),)),
                          ("dsync",), ("hread", (1, "all"))))
TALK_FIX = ((NB, NB), 2, (("launch", 0, (), ((0, "all"),)), ("record", 1, 0), ("wait", 1, 1),
                          ("launch", 1, ((0, "all"),), ((1, "all"),)), ("dsync",), ("hread", (1, "all"))))
# A wait before a re-record, and the legacy stream joining two blocking streams.
# Two devices: cuda:1's blocking stream does not join cuda:0's legacy stream (racy); its own
# legacy stream it does (safe); a device synchronize of cuda:1 leaves cuda:0's write unordered.
OTHER_DEVICES_LEGACY = ((L, B), 2, (("launch", 0, (), ((0, "all"),)), ("launch", 1, ((0, "all"),), ())), (0, 1))
OWN_LEGACY = ((L, B, L), 2, (("launch", 2, (), ((0, "all"),)), ("launch", 1, ((0, "all"),), ())), (0, 1, 1))
SYNC_OTHER_DEVICE = ((NB, NB), 2, (("launch", 0, (), ((0, "all"),)), ("dsync", 1), ("hread", (0, "all"))), (0, 1))
WAIT_BEFORE_RERECORD = ((NB, NB), 2, (("record", 1, 0), ("launch", 0, (), ((0, "lo"),)), ("wait", 1, 1),
                                      ("record", 1, 0), ("launch", 1, ((0, "lo"),), ())))
LEGACY_BRIDGE = ((L, B, B), 2, (("launch", 1, (), ((0, "hi"),)), ("launch", 0, (), ((1, "lo"),)),
                                ("launch", 2, ((0, "all"),), ())))

# The host issues later work only after a sync returns, even on a stream that saw the host before.
SYNC_THEN_ISSUE = ((NB, NB), 2, (("launch", 1, (), ((1, "all"),)), ("launch", 0, (), ((0, "all"),)),
                                 ("ssync", 0), ("launch", 1, ((0, "all"),), ())))
# A read that covers an earlier write does not hide that write from a later unordered reader.
READ_COVERS_WRITE = ((NB, NB), 2, (("launch", 0, (), ((0, "lo"),)), ("launch", 0, ((0, "all"),), ()),
                                   ("launch", 1, ((0, "lo"),), ())))


@settings(max_examples=_examples(), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@example(TALK_BUG)
@example(TALK_FIX)
@example(WAIT_BEFORE_RERECORD)
@example(LEGACY_BRIDGE)
@example(SYNC_THEN_ISSUE)
@example(READ_COVERS_WRITE)
@example(OTHER_DEVICES_LEGACY)
@example(OWN_LEGACY)
@example(SYNC_OTHER_DEVICE)
@given(programs())
def test_checker_agrees_with_oracle(program):
    kinds, n_buffers, ops, *devices = program
    devices = devices[0] if devices else None
    preds = must_happen_before(kinds, ops, devices)
    unordered = unordered_conflicts(ops, ancestors(preds))
    racy_values = value_racy(n_buffers, ops, preds)
    races = check(to_trace(kinds, n_buffers, ops, devices))
    report = format_report(races)
    event("value-racy" if racy_values else "hb-racy only" if unordered else "race-free")

    # 3 (oracle consistency): values can differ only if some conflicting pair is unordered.
    assert not racy_values or unordered
    # 1: the checker reports a race exactly when some conflicting pair is unordered.
    assert bool(races) == bool(unordered), f"oracle's unordered pairs: {unordered}\n{report}"
    # 2: every report is a real unordered pair with a kind it has; no later access is missed.
    for race in races:
        pair = (race.first.site.line - 1, race.second.site.line - 1)
        assert pair in unordered, f"{pair} is ordered by the oracle's DAG\n{report}"
        assert race.kind in unordered[pair], report
    assert {r.second.site.line - 1 for r in races} == {j for _, j in unordered}, report
    # 3: whatever two orders can disagree on, the checker flags.
    assert not racy_values or races


def test_oracle_examples_classified_as_expected():
    """The oracle itself on hand-written programs: a broken oracle would make the property vacuous."""
    for program, value_race, unordered_pairs in [
        (TALK_BUG, True, {(0, 1)}),
        (TALK_FIX, False, set()),
        (WAIT_BEFORE_RERECORD, True, {(1, 4)}),
        (LEGACY_BRIDGE, False, set()),
        (SYNC_THEN_ISSUE, False, set()),
        (READ_COVERS_WRITE, True, {(0, 2)}),
        (OTHER_DEVICES_LEGACY, True, {(0, 1)}),
        (OWN_LEGACY, False, set()),
        (SYNC_OTHER_DEVICE, True, {(0, 2)}),
        # Two unordered writes, both overwritten before anyone looks: hb-racy, not value-racy.
        (((NB, NB), 2, (("launch", 0, (), ((0, "lo"),)), ("launch", 1, (), ((0, "lo"),)), ("dsync",),
                        ("hwrite", (0, "all")))), False, {(0, 1)}),
        # Disjoint halves: no conflict at all.
        (((NB, NB), 2, (("launch", 0, (), ((0, "lo"),)), ("launch", 1, (), ((0, "hi"),)), ("dsync",),
                        ("hread", (0, "all")))), False, set()),
    ]:
        kinds, n_buffers, ops, *devices = program
        preds = must_happen_before(kinds, ops, devices[0] if devices else None)
        assert value_racy(n_buffers, ops, preds) is value_race, ops
        assert set(unordered_conflicts(ops, ancestors(preds))) == unordered_pairs, ops


def allowed(order, preds) -> bool:
    position = {op: k for k, op in enumerate(order)}
    return all(position[p] < position[i] for i, before in enumerate(preds) for p in before)


def execute(n_buffers, ops, order) -> dict:
    """Run the operations in `order`; return each one's reads."""
    memory = {(b, c): ("initial", b, c) for b in range(n_buffers) for c in range(2)}
    reads = {}
    for i in order:
        reads[i] = tuple(memory[b, c] for b, cells, w in accesses(ops[i]) if not w for c in cells)
        for b, cells, w in accesses(ops[i]):
            if w:
                memory.update({(b, c): ("written by", i) for c in cells})
    return reads


def test_oracle_lets_the_consumer_read_the_stale_value():
    """The talk's bug: post-scale (op 1) may run before the matmul (op 0) and read the
    buffer's old contents (the previous decode step's value); with the fix it may not."""
    kinds, n_buffers, ops = TALK_BUG
    preds = must_happen_before(kinds, ops)
    assert allowed([1, 0, 2, 3], preds) and allowed([0, 1, 2, 3], preds)
    assert execute(n_buffers, ops, [1, 0, 2, 3])[1] == (("initial", 0, 0), ("initial", 0, 1))
    assert execute(n_buffers, ops, [0, 1, 2, 3])[1] == (("written by", 0),) * 2
    assert not allowed([0, 1, 3, 2], preds)  # the host read waits for the device sync

    kinds, n_buffers, ops = TALK_FIX
    preds = must_happen_before(kinds, ops)
    assert not allowed([2, 3, 0, 1, 4, 5], preds)  # a wait issued after the record waits for it
    assert not allowed([1, 2, 3, 0, 4, 5], preds)  # the record follows the matmul on its stream


# --- race-directed confirmation against the FlashNorm plan oracle ---------------------------
# flashnorm_kernels.testing.oracle decides by graph reachability which sync plans of the
# dual-stream decode loop leave two accesses unordered. For each such plan, holding a reported
# race's first access until its second has run (streamcheck.proofs.confirm) must make a value differ
# from the sequential run: a read, or the bytes both writes left.

@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plan=unsafe_plans())
def test_confirmation_makes_every_plan_the_oracle_calls_racy_strike(plan):
    results = confirm_races(partial(run_program, plan, Shape(2, 8, 4)))
    assert results, f"{plan.describe()}: the oracle calls it racy, the checker reports nothing"
    confirmed = [c for c in results if c.confirmed]
    assert confirmed, f"{plan.describe()}: no race struck\n" + "\n".join(c.format() for c in results)
    for c in confirmed:  # the line a CI log shows carries both values
        assert f"= {c.got!r}, the sequential run " in c.format() and f" {c.expected!r} (held `" in c.format()
    event(f"{len(confirmed)} of {len(results)} races confirmed")
