"""Deliberate small mutations of rules the CPU suite must notice, one at a time.

Each mutation is (name, file, old text, new text, tests): the old text must occur exactly once
in the file. For each, a temporary copy of the working tree (tracked and untracked files that
git does not ignore; never the working tree itself, others edit it) gets the new text and the
listed tests run there; a mutant the tests pass is a rule no test pins. A new rule gets its line
here, and its test the first time this prints it as survived.

    python tools/mutate.py            every mutation, then the table
    python tools/mutate.py --list     the names
    python tools/mutate.py NAME ...   only those (and the baseline)

Exit status: 0 every mutant killed, 1 some survived (or the unmutated tests fail), 2 bad usage.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclass(frozen=True)
class Mutation:
    name: str
    file: str
    old: str
    new: str
    tests: tuple


MUTATIONS = (
    # --- recorder and its adapters -------------------------------------------------------
    Mutation("legacy-handle-1", "streamcheck/record/recorder.py",
             "        if ptr in (0, 1):  # null stream / cudaStreamLegacy\n",
             "        if ptr == 0:  # null stream / cudaStreamLegacy\n",
             ("tests/streamcheck/record/test_recorder.py",)),
    Mutation("fresh-result-not-a-write", "streamcheck/record/adapters/torch_ops.py",
             "        writes += fresh\n",
             "        reads += fresh\n",
             ("tests/streamcheck/record/adapters/test_torch_ops.py", "tests/streamcheck/record/test_recorder.py")),
    Mutation("unknown-param-read", "streamcheck/record/recorder.py",
             '            kind = spec.get(i, "w")\n',
             '            kind = spec.get(i, "r")\n',
             ("tests/streamcheck/record/test_recorder.py",)),
    Mutation("non-blocking-read-syncs", "streamcheck/record/recorder.py",
             "        if blocking:\n            self.record(T.StreamSync(tid, site, stream=sid, cause=name))\n",
             "        if True:\n            self.record(T.StreamSync(tid, site, stream=sid, cause=name))\n",
             ("tests/streamcheck/record/test_recorder.py",)),
    Mutation("compute-result-not-written", "streamcheck/record/recorder.py",
             "        written += [r for r in results if self.is_new(r, serial0, tid)]\n",
             "        written += []\n",
             ("tests/streamcheck/record/test_recorder.py",)),
    Mutation("pageable-copy-asynchronous", "streamcheck/record/adapters/torch_ops.py",
             '        return "cuda" in kinds and any(t.device.type == "cpu" and not k for t, k in zip(tensors, kinds))\n',
             "        return False\n",
             ("tests/streamcheck/record/adapters/test_torch_ops.py",)),
    # --- the sim's schedules ---------------------------------------------------------------
    Mutation("delay-one-step-longer", "streamcheck/core/schedule.py",
             "        return op.issued_at + self.steps\n",
             "        return op.issued_at + self.steps + 1\n",
             ("tests/streamcheck/core/test_schedule.py", "tests/streamcheck/device/backends/test_sim_rules.py")),
    Mutation("graph-node-delay-one-step-longer", "streamcheck/device/backends/sim.py",
             "        issued_at = self.now + 1\n        for (node, run, args, name, kind), deps in zip(",
             "        issued_at = self.now + 2\n        for (node, run, args, name, kind), deps in zip(",
             ("tests/streamcheck/device/backends/test_capture_sim.py",)),
    Mutation("confirm-holds-later-occurrences", "streamcheck/core/schedule.py",
             "                and self._seen.get(target.key, 0) == target.occurrence)\n",
             "                and self._seen.get(target.key, 0) >= target.occurrence)\n",
             ("tests/streamcheck/core/test_schedule.py", "tests/streamcheck/proofs/test_confirm.py")),
    Mutation("directed-delay-on-a-free-by-name", "streamcheck/core/schedule.py",
             '    return stream, (None if name.startswith("copy ") or name == "free" else name)\n',
             '    return stream, (None if name.startswith("copy ") else name)\n',
             ("tests/streamcheck/core/test_schedule.py", "tests/streamcheck/proofs/test_confirm.py")),
    # --- folding ---------------------------------------------------------------------------
    Mutation("tied-only-by-identity", "flashnorm_kernels/fold.py",
             "    shared = head is embed or head.untyped_storage().data_ptr() == embed.untyped_storage().data_ptr()\n",
             "    shared = head is embed\n",
             ("tests/flashnorm_kernels/test_fold.py",)),
    Mutation("gain-in-weight-dtype", "flashnorm_kernels/fold.py",
             "    cdt = torch.promote_types(w.dtype, torch.float32)\n",
             "    cdt = w.dtype\n",
             ("tests/flashnorm_kernels/test_fold.py",)),
    Mutation("is-folded-by-presence", "flashnorm_kernels/fold.py",
             '    return isinstance(marker, dict) and bool(marker.get("folded"))\n',
             '    return isinstance(marker, dict) and "folded" in marker\n',
             ("tests/flashnorm_kernels/test_fold.py",)),
    # --- the sync audit ----------------------------------------------------------------------
    Mutation("device-side-not-rechecked", "streamcheck/analyses/sync_audit.py",
             "            if plan is not None and _clean(edit(ops, swap_at={sync.indexes[n - 1]: plan for n in device_at}), "
             "base):\n",
             "            if plan is not None:\n",
             ("tests/streamcheck/analyses/test_sync_audit.py",)),
    Mutation("shared-bytes-write-write-only", "streamcheck/analyses/sync_audit.py",
             "                if actor != who and (wrote or write) and any(",
             "                if actor != who and (wrote and write) and any(",
             ("tests/streamcheck/analyses/test_sync_audit.py",)),
    Mutation("implied-by-one-occurrence", "streamcheck/analyses/sync_audit.py",
             '        if sync.kind != "legacy join" and not adds_order[sync.key]:\n',
             '        if sync.kind != "legacy join" and len(adds_order[sync.key]) < sync.count:\n',
             ("tests/streamcheck/analyses/test_sync_audit.py",)),
    Mutation("proof-ignores-values", "streamcheck/proofs/sync_proof.py",
             "            diff = compare(want, got)\n",
             "            diff = None\n",
             ("tests/streamcheck/proofs/test_sync_proof.py",)),
    Mutation("proof-ignores-races", "streamcheck/proofs/sync_proof.py",
             "            new = [race for race in device.races if race.key not in base]\n",
             "            new = []\n",
             ("tests/streamcheck/proofs/test_sync_proof.py",)),
    # --- the happens-before checker ----------------------------------------------------------
    Mutation("zero-length-access-counts", "streamcheck/core/hb.py",
             "        if start >= stop:\n            return\n",
             "        if start > stop:\n            return\n",
             ("tests/streamcheck/core/test_hb_rules.py",)),
    Mutation("event-query-orders-nothing", "streamcheck/core/hb.py",
             "op.event, event.name) or not op.done:\n            return\n        if event.state is not None:\n",
             "op.event, event.name) or True:\n            return\n        if event.state is not None:\n",
             ("tests/streamcheck/core/test_hb_rules.py", "tests/streamcheck/record/adapters/test_queries.py")),
    # --- host threads' hand-offs (issue 31 §3) ---------------------------------------------------
    Mutation("take-over-orders-nothing", "streamcheck/core/hb.py",
             "        if channel:\n            self._host_join(self._threads[op.thread], channel)\n",
             "        if False:\n            self._host_join(self._threads[op.thread], channel)\n",
             ("tests/streamcheck/core/test_hb_rules.py",)),
    Mutation("timed-out-event-wait-takes-over", "streamcheck/host_handoffs.py",
             "        if signaled and _listeners and not _from_stdlib():\n",
             "        if _listeners and not _from_stdlib():\n",
             ("tests/streamcheck/test_host_handoffs.py", "tests/streamcheck/device/test_device_api.py")),
    Mutation("failed-acquire-takes-over", "streamcheck/host_handoffs.py",
             "        if acquired and _listeners:\n",
             "        if _listeners:\n",
             ("tests/streamcheck/test_host_handoffs.py",)),
    Mutation("queue-get-takes-over-nothing", "streamcheck/host_handoffs.py",
             '                _take_over(channel, "Queue.get")\n',
             "                pass\n",
             ("tests/streamcheck/device/test_device_api.py", "tests/streamcheck/record/adapters/test_threads.py")),
    Mutation("queue-internal-conditions-heard", "streamcheck/host_handoffs.py",
             "_OWN_FILES = frozenset((threading.__file__, queue.__file__))\n",
             "_OWN_FILES = frozenset((threading.__file__,))\n",
             ("tests/streamcheck/test_host_handoffs.py",)),
    Mutation("thread-target-primitive-not-heard", "streamcheck/host_handoffs.py",
             "    return code.co_filename in _OWN_FILES and code is not _THREAD_RUN\n",
             "    return code.co_filename in _OWN_FILES\n",
             ("tests/streamcheck/test_host_handoffs.py",)),
    Mutation("stale-device-hears-hand-offs", "streamcheck/device/api.py",
             "        return dev is not None and joined is not None and joined() is dev\n",
             "        return dev is not None and threading.get_ident() in dev._threads\n",
             ("tests/streamcheck/device/test_device_api.py",)),
    # --- the per-run time limit --------------------------------------------------------------
    Mutation("timeout-interrupt-is-an-exception", "streamcheck/timeout.py",
             "class Interrupted(BaseException):\n",
             "class Interrupted(Exception):\n",
             ("tests/streamcheck/test_timeout.py",)),
)


def _tree_files() -> list:
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                            capture_output=True).stdout.decode().split("\0")
    return [name for name in listed if name and os.path.isfile(os.path.join(ROOT, name))]


def _copy_tree(files: list, into: str) -> None:
    for name in files:
        target = os.path.join(into, name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copy2(os.path.join(ROOT, name), target)


def _run_tests(tree: str, tests: tuple) -> tuple:
    """(pytest's exit status, seconds) for `tests` in `tree`, importing the copy's packages."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [tree, os.environ.get("PYTHONPATH")])))
    env.pop("PYTEST_ADDOPTS", None)
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                           *tests], cwd=tree, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return done.returncode, time.perf_counter() - start


def _verdict(status: int) -> str:
    # pytest: 0 passed, 1 some test failed; anything else (collection error, usage) is no verdict.
    return {0: "SURVIVED", 1: "killed"}.get(status, f"error (pytest exit {status})")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="tools/mutate.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="mutations to run (default: all)")
    parser.add_argument("--list", action="store_true", help="print the mutations' names and exit")
    args = parser.parse_args(argv)
    known = {m.name: m for m in MUTATIONS}
    if args.list:
        print("\n".join(known))
        return 0
    unknown = [name for name in args.names if name not in known]
    if unknown:
        print(f"tools/mutate.py: unknown mutation {', '.join(unknown)}; --list names them", file=sys.stderr)
        return 2
    chosen = [known[name] for name in args.names] or list(MUTATIONS)
    files = _tree_files()
    rows, survived = [], False
    with tempfile.TemporaryDirectory(prefix="streamcheck-mutate-") as scratch:
        tree = os.path.join(scratch, "tree")
        _copy_tree(files, tree)
        tests = tuple(sorted({t for m in chosen for t in m.tests}))
        status, seconds = _run_tests(tree, tests)
        print(f"baseline (no mutation): {'passed' if status == 0 else f'FAILED (pytest exit {status})'} "
              f"in {seconds:.0f} s", flush=True)
        if status != 0:
            print("tools/mutate.py: the unmutated tests fail; fix them first, a mutant's result would mean nothing",
                  file=sys.stderr)
            return 1
        for mutation in chosen:
            path = os.path.join(tree, mutation.file)
            with open(path, encoding="utf-8") as f:
                original = f.read()
            if original.count(mutation.old) != 1:
                rows.append((mutation.name, f"error (its old text occurs {original.count(mutation.old)} times "
                                            f"in {mutation.file}: update the mutation)", 0.0))
                survived = True
                continue
            with open(path, "w", encoding="utf-8") as f:
                f.write(original.replace(mutation.old, mutation.new))
            try:
                status, seconds = _run_tests(tree, mutation.tests)
            finally:
                with open(path, "w", encoding="utf-8") as f:
                    f.write(original)
            verdict = _verdict(status)
            survived |= verdict != "killed"
            rows.append((mutation.name, verdict, seconds))
            print(f"{mutation.name}: {verdict} ({seconds:.0f} s)", flush=True)
    width = max(len(name) for name, _, _ in rows)
    print()
    for name, verdict, seconds in rows:
        print(f"{name:<{width}}  {verdict}")
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
