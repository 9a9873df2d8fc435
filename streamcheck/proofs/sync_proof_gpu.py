"""The sync audit's proof on the GPU (`streamcheck run --audit-syncs --prove`): the script rerun in
fresh processes with the synchronizations outside the audit's minimal set actually skipped
(the recorder does not make the call; a replaced host synchronize becomes a driver event
recorded on the producer's stream and a wait on the consumer's), then timed with and without.

- reference: one rerun as recorded (no delay): its standard output is the values;
- edited reruns under seed-chosen delays (`--delay-us`): the same output and no race beyond the
  recorded run's own is "removable on this run";
- timing: the script's span (CUDA events on the legacy stream, the device synchronized at both
  ends), median of repeats, as recorded and edited, each under recording.

A rerun that issued other synchronizations than the audit knows, or one the recorder saw only
after it ran, is claimed nothing of: the rerun could not skip it. torch's Python-level syncs
(`torch.cuda.synchronize`, `Stream.synchronize`, `Event.synchronize`, `Event.wait` and so
`wait_stream`) are skipped at their entry point (adapters/torch_runtime.py); those torch makes
inside C++ (`.item()`, `.cpu()`, `nonzero()`) reach the recorder only through its callbacks,
after the call, and are named as not skippable.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass

PROOF_DELAYED_RUNS = 3  # edited reruns under delays (seeds 0, 1, 2)
TIMING_REPEATS = 3  # timed reruns each, as recorded and edited
DELAY_US = 200.0
SPAN_PREFIX = "streamcheck: script span "  # the line a --time-script rerun prints (microseconds)


@dataclass(frozen=True)
class GpuProof:
    removable: object  # True, False, or None (not claimed)
    lines: tuple  # what to print
    skipped: tuple = ()  # finding numbers the reruns skipped or replaced
    edits: str = ""  # the reruns' --skip-syncs edit list (SyncEdits.to_json)
    spans: tuple = ((), ())  # script spans in µs of the timed reruns: (as recorded, edited)

    def format(self) -> str:
        return "\n".join(("streamcheck: proof on the GPU:",) + tuple(f"  {line}" for line in self.lines))

    def to_dict(self) -> dict:
        return {"removable": self.removable, "lines": list(self.lines), "skipped": list(self.skipped),
                "skip_syncs": self.edits, "spans_us": {"as recorded": list(self.spans[0]),
                                                       "edited": list(self.spans[1])}}


def _rerun(script: str, script_args, *options, timeout: float = 600) -> tuple:
    """(the finished process, its --json report as a dict) of `streamcheck run <options> script`."""
    with tempfile.TemporaryDirectory(prefix="streamcheck-prove-") as tmp:
        report = os.path.join(tmp, "report.json")
        cmd = [sys.executable, "-m", "streamcheck.cli", "run", "--json", report, *options, script,
               *script_args]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        data = {}
        if os.path.exists(report):
            with open(report, encoding="utf-8") as f:
                data = json.load(f)
    return proc, data


def _span_us(stderr: str):
    for line in stderr.splitlines():
        if line.startswith(SPAN_PREFIX):
            return float(line[len(SPAN_PREFIX):].split()[0])
    return None


def time_spans(script: str, script_args, edits: str, repeats: int = TIMING_REPEATS) -> tuple:
    """(as recorded, edited): the script's span in µs of `repeats` timed reruns each, under
    recording, interleaved so that a drift of the GPU's clocks reaches both alike; `edits`: the
    --skip-syncs list. A rerun that did not report its span is left out."""
    spans = ([], [])
    for _ in range(repeats):
        for out, options in zip(spans, ((), ("--skip-syncs", edits))):
            proc, _ = _rerun(script, script_args, "--time-script", *options)
            span = _span_us(proc.stderr)
            if span is not None:
                out.append(span)
    return tuple(spans[0]), tuple(spans[1])


def _names(audit, keys) -> list:
    """"#3 (stream synchronize at prog.py:12)" for each sync (its audit key as str(), as a rerun's
    --json gives it); the key itself for one the audit does not know."""
    from ..core.trace import site_path

    found = {str(f.sync.key): f for f in audit.findings}
    return [f"#{found[k].number} ({found[k].sync.kind} at {site_path(found[k].sync.site)})" if k in found else k
            for k in keys]


def unskipped_line(audit, keys) -> str:
    """'not claimed' naming the syncs (audit keys, as their str()) a rerun made anyway."""
    names = _names(audit, sorted(keys))
    return ("not claimed: the rerun could not skip " + ", ".join(names) + ": the recorder saw it only after the call "
            "(torch synchronizes inside C++ for `.item()`, `.cpu()`, `nonzero()` and the like), or its replacement "
            "needs a stream or event the rerun cannot name yet")


def other_path_line(audit, differences) -> str:
    """'not claimed' naming the first sync (its audit key as str()) the rerun issued another
    number of times than the recorded run, with both counts."""
    if not differences:
        return "not claimed: the rerun issued other synchronizations than the recorded run (not deterministic)"
    key, got, recorded = differences[0]
    name = _names(audit, [key])[0]
    return (f"not claimed: the rerun issued {name} {got} time(s), the recorded run {recorded} (not deterministic "
            "between runs, or a call the recorder counted twice)")


def _numbered(finding, occurrences: tuple, how: str) -> str:
    """"#3", "#3 (as its device-side wait)", "#2 (at occurrences 1, 2 of 3)": the reruns skip
    occurrences, not only whole sites."""
    from ..analyses.sync_audit import occurrences_phrase

    notes = [how] if how else []
    if len(occurrences) != finding.sync.count:
        notes.append(occurrences_phrase(occurrences, finding.sync.count))
    return f"#{finding.number}" + (f" ({', '.join(notes)})" if notes else "")


def prove(audit, races, script: str, script_args=(), *, seed: int = 0) -> GpuProof:
    """`audit`: the recorded run's sync audit; `races`: its races (they are allowed again)."""
    numbers = [_numbered(f, f.removed_at, "") for f in audit.findings if f.removed_at]
    numbers += [_numbered(f, f.replaced_at, "as its device-side wait") for f in audit.findings if f.replaced_at]
    if not numbers:
        return GpuProof(None, ("not claimed: the minimal set is every synchronization, nothing to skip",))
    edits = audit.edits().to_json()
    skip = ("--skip-syncs", edits)
    allowed = len(races)
    reference, _ = _rerun(script, script_args)
    if reference.returncode != 0:
        return GpuProof(None, (f"not claimed: the reference rerun exited {reference.returncode}",))
    lines = []
    removable = True
    for i in range(PROOF_DELAYED_RUNS):
        proc, data = _rerun(script, script_args, *skip, "--delay-us", str(DELAY_US), "--seed", str(seed + i))
        edit = data.get("skip_syncs", {})
        if edit.get("unskipped"):
            return GpuProof(None, (unskipped_line(audit, edit["unskipped"]),))
        if not edit.get("same_path", False):
            return GpuProof(None, (other_path_line(audit, edit.get("differences", [])),))
        new = len(data.get("races", [])) - allowed
        problems = []
        if proc.stdout != reference.stdout:
            problems.append("its output differs from the reference rerun's")
        if new > 0:
            problems.append(f"{new} new race(s)")
        if proc.returncode != reference.returncode:
            problems.append(f"exit {proc.returncode}, the reference {reference.returncode}")
        lines.append(f"delay {DELAY_US:g} µs, seed {seed + i}: " + ("; ".join(problems) or "same output, no new race"))
        removable = removable and not problems
    lines.insert(0, ("removable on this run: " if removable else "NOT removable: ") + ", ".join(numbers)
                 + f" skipped in {PROOF_DELAYED_RUNS} reruns under delays")
    spans = time_spans(script, script_args, edits)
    if all(spans):
        before, after = (statistics.median(s) for s in spans)
        lines.append(f"time (script span, CUDA events, median of {TIMING_REPEATS}, under recording): "
                     f"{before:.0f} µs as recorded, {after:.0f} µs edited: saves {before - after:.0f} µs "
                     f"({(before - after) / before:.1%})")
    else:
        lines.append("time: the timed reruns did not report their span")
    return GpuProof(removable, tuple(lines), tuple(audit.removed + audit.replaced), edits, spans)
