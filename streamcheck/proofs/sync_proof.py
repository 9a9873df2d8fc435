"""The sync audit's proof on execution, on the sim: rerun a device-API program with the
synchronizations outside the audit's minimal set actually skipped (and its replacements
issued), under delays and random schedules, and show that each necessary one strikes when
skipped alone.

`prove(program)` runs `program(device)` (a callable taking a Device, as run_schedules' programs
are) sequentially, audits that run (streamcheck.analyses.sync_audit), then:

- removable on this run: every edited rerun gave the sequential reference's values and no race
  beyond the recorded run's own;
- each necessary sync skipped alone: its first prevented race confirmed by race-directed
  confirmation (streamcheck.proofs.confirm), which holds the race's first access and reads the values.

A rerun that issued other synchronizations than the recorded run (the program is not
deterministic between runs) is claimed nothing of. The GPU twin (timing a step with and without
the removable syncs) goes with `streamcheck run --audit-syncs`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from ..analyses.sync_audit import Audit, Verdict, audit, occurrences_phrase
from .confirm import MAX_RACES, confirm
from ..device import Device
from ..plugin.results import compare

PROOF_SCHEDULES = 8  # edited reruns: delay and random schedules, alternately


@dataclass(frozen=True)
class Proof:
    audit: Audit
    removable: Optional[bool]  # None: not claimed (nothing to remove, or not deterministic)
    runs: tuple  # (schedule, problem or "") of each edited rerun
    confirmations: tuple  # (finding number, Confirmation) for necessary syncs skipped alone
    why: str = ""  # why nothing is claimed

    def to_dict(self) -> dict:
        """For `streamcheck run --json` (its GPU twin: sync_proof_gpu.GpuProof.to_dict)."""
        return {"backend": "sim", "removable": self.removable, "why": self.why,
                "runs": [{"schedule": schedule, "problem": problem} for schedule, problem in self.runs],
                "confirmations": [{"finding": number, **confirmation.to_dict()}
                                  for number, confirmation in self.confirmations]}

    def format(self) -> str:
        lines = [self.audit.format(), "", "proof on execution (sim):"]
        if self.removable is None:
            lines.append(f"  not claimed: {self.why}")
        else:
            edits = [f"#{f.number} skipped{_where(f, f.removed_at)}" for f in self.audit.findings if f.removed_at]
            edits += [f"#{f.number} replaced by its device-side wait{_where(f, f.replaced_at)}"
                      for f in self.audit.findings if f.replaced_at]
            bad = [(s, p) for s, p in self.runs if p]
            if self.removable:
                lines.append(f"  removable on this run: with {', '.join(edits)}, {len(self.runs)} reruns under delays "
                             "and random schedules gave the sequential reference's values and no race")
            else:
                lines.append(f"  NOT removable: {len(bad)} of {len(self.runs)} edited reruns went wrong")
                for schedule, problem in bad[:3]:
                    lines.append(f"    {schedule}: {problem}")
        for number, confirmation in self.confirmations:
            lines.append(f"  #{number} skipped alone: {confirmation.format()}")
        return "\n".join(lines)


def _where(finding, occurrences: tuple) -> str:
    """"" where every occurrence, else " at occurrences 1, 2 of 3" and the like."""
    if len(occurrences) == finding.sync.count:
        return ""
    return " " + occurrences_phrase(occurrences, finding.sync.count)


def _run(program: Callable, device: Device):
    """The program's result and how many operations it issued (the final synchronize, which
    lets what is still pending run, is the harness's, not the program's)."""
    value = program(device)
    issued = len(device.trace)
    device.edit_syncs(None)
    device.synchronize()
    return value, issued


def prove(program: Callable, *, schedules: int = PROOF_SCHEDULES, seed: int = 0,
          max_races: int = MAX_RACES) -> Proof:
    if not callable(program):
        raise TypeError(f"prove: program must be a callable taking a Device, got {type(program).__name__}")
    reference = Device("sim", policy="sequential")
    want, issued = _run(program, reference)
    result = audit(reference.trace.ops[:issued])
    # Each synchronization as often as the recorded run issued it (queries are never edited).
    counts = {f.sync.key: f.sync.count for f in result.findings if f.sync.kind != "query"}
    base = {race.key for race in result.races}
    runs = []
    removable: Optional[bool] = None
    why = ""
    if not (result.removed or result.replaced):
        why = "the minimal set is every synchronization: nothing to skip"
    else:
        removable = True
        for i in range(schedules):
            policy = ("delay", "random")[i % 2]
            device = Device("sim", policy=policy, seed=seed + i)
            edits = result.edits()
            device.edit_syncs(edits)
            got, _ = _run(program, device)
            label = f"{policy} seed {seed + i}"
            differences = edits.path_differences(counts)
            if differences:
                key, times, recorded = differences[0]
                number = next((f"#{f.number} ({f.sync.kind} at {f.sync.site})" for f in result.findings
                               if f.sync.key == key), f"{key[0]} at {key[1]}:{key[2]}")
                removable, why = None, (f"the rerun issued {number} {times} time(s), the recorded run {recorded} (the "
                                        "program is not deterministic between runs: its call sites or their counts "
                                        "differ); nothing claimed")
                runs = []
                break
            new = [race for race in device.races if race.key not in base]
            diff = compare(want, got)
            problem = "; ".join(filter(None, [diff, f"{len(new)} new race(s): {new[0].format()}" if new else ""]))
            runs.append((label, problem))
            if problem:
                removable = False
    confirmations = []
    necessary = [f for f in result.findings if f.verdict in (Verdict.NECESSARY, Verdict.HOST_NEEDED,
                                                                 Verdict.DEVICE_SIDE) and f.prevents]
    for finding in necessary[:max_races]:
        def without(device, number=finding.number):
            device.edit_syncs(result.edits(only=number))
            return program(device)
        confirmations.append((finding.number, confirm(without, finding.prevents[0], seed=seed)))
    return Proof(result, removable, tuple(runs), tuple(confirmations), why)
