"""What streamcheck prints and writes: the header, race reports in failures (and beside other
failures), the JSON `streamcheck` property --junitxml keeps, the terminal summary, and the
trace files of failing tests under --streamcheck-trace-dir.

The header is shown only in a run that uses streamcheck (usage.py): with the others when an
option is given, else after "collected N items" when a collected test uses it, else (the xdist
controller, which collects nothing) at the top of the terminal summary.

The fixtures record what they saw in a Findings in the item's stash; the hooks here turn it
into reports. Lines are wrapped at the terminal's width; replay lines stay whole.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import textwrap
from dataclasses import dataclass, field
from typing import Any, Optional

import pytest

from .options import SETTINGS_KEY, backend_name
from .seeds import ScheduleSpec, base_seed
from .usage import in_use

WORKER_WIDTH_KEY = "streamcheck_width"  # the controller's terminal width: workers' reports print there
HEADER_SHOWN_KEY = pytest.StashKey[bool]()
PROPERTY = "streamcheck"  # the user property of each test that used a fixture: its findings as JSON
RACES_SECTION = "streamcheck races"  # a report's section: the races beside another outcome


@dataclass
class Findings:
    """What streamcheck saw in one test (kept in item.stash)."""

    races: dict = field(default_factory=dict)  # Race.key -> Race
    schedules: int = 0
    wrong: int = 0
    replay: str = ""
    schedule: str = ""  # the failing schedule with its full decisions (the message may elide them)
    device: Any = None  # the streamcheck_device fixture's device, if used
    recording: Any = None  # the streamcheck_gpu fixture's recording (instrument.Session), if used
    spec: Optional[ScheduleSpec] = None  # and the schedule it runs
    check: str = "on"  # the test's check mode (option, or its marker)
    sync_audit: Any = None  # with --streamcheck-audit-syncs: the audit of its sequential run

    def add_races(self, races) -> None:
        for race in races:
            self.races.setdefault(race.key, race)


FINDINGS_KEY = pytest.StashKey[Findings]()


def findings(item) -> Findings:
    """The item's Findings, made on first use."""
    found = item.stash.get(FINDINGS_KEY, None)
    if found is None:
        found = item.stash[FINDINGS_KEY] = Findings()
    return found


class ScheduleFailure(AssertionError):
    """A schedule produced values the sequential reference did not, or the checker found races."""

    # Where users import it from, and the name pytest prints before the message.
    __module__ = "streamcheck.plugin"


# pytest prints each line of an exception's message after `E` and the failing line's indent
# (`E       ` for a line in a test function), and the first after the exception's name too.
EXCEPTION_MARGIN = 8
EXCEPTION_NAME = f"{ScheduleFailure.__module__}.{ScheduleFailure.__name__}: "


def pytest_configure(config: pytest.Config) -> None:
    """Register the terminal summary."""
    config.pluginmanager.register(_Summary(config), "streamcheck-summary")


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    """xdist controller: workers wrap their reports at the controller's width, where they are printed."""
    node.workerinput[WORKER_WIDTH_KEY] = terminal_width(node.config)


def header_line(config) -> str:
    """The settings, and the seed that replays the run (resolving `auto` may import CuPy: only
    in a run that uses streamcheck)."""
    s = config.stash[SETTINGS_KEY]
    replay = f" replay={s.replay[0]}:{s.replay[1]}" if s.replay else ""
    return (f"streamcheck: backend={backend_name(config)} policy={','.join(s.policies)} schedules={s.schedules} "
            f"check={s.check}{replay} --streamcheck-seed={base_seed(config)}")


def _show_header(config) -> list:
    """The header line, the first time it is asked for in a run that uses streamcheck (and
    shows pytest's header: not under -q or --no-header)."""
    if (not in_use(config) or config.stash.get(HEADER_SHOWN_KEY, False) or config.get_verbosity() < 0
            or config.getoption("no_header", False)):
        return []
    config.stash[HEADER_SHOWN_KEY] = True
    from ..core.fast import notice  # here, not at import: the plugin loads nothing until streamcheck is used
    checker = notice()  # one line, only where the Python checker stands in for the native one
    return [header_line(config)] + ([checker] if checker else [])


def pytest_report_header(config) -> list:
    """The header line, when an option says the run uses streamcheck."""
    return _show_header(config)


def pytest_report_collectionfinish(config, items) -> list:
    """The header line, when it is the tests that use streamcheck (after "collected N items");
    and the tests whose marker runs other settings than the header's."""
    lines = _show_header(config)
    overrides = [(item.nodeid, _marker_settings(item)) for item in items]
    overrides = [(nodeid, settings) for nodeid, settings in overrides if settings]
    if overrides and config.get_verbosity() >= 0:
        shown = "; ".join(f"{nodeid} ({settings})" for nodeid, settings in overrides[:MARKERS_LISTED])
        more = f"; and {len(overrides) - MARKERS_LISTED} more" if len(overrides) > MARKERS_LISTED else ""
        lines.append(f"streamcheck: @pytest.mark.streamcheck overrides these in {len(overrides)} "
                     f"test{'s' if len(overrides) != 1 else ''}: {shown}{more}")
    return lines


MARKERS_LISTED = 3  # tests named in the header's marker line


def _marker_settings(item) -> str:
    """`schedules=3 policies=random`: what the test's marker sets of the header's settings."""
    marker = item.get_closest_marker("streamcheck")
    if marker is None:
        return ""
    shown = []
    for key, header_name in (("policies", "policy"), ("schedules", "schedules"), ("check", "check")):
        if key in marker.kwargs:
            value = marker.kwargs[key]
            if isinstance(value, (list, tuple)):
                value = ",".join(map(str, value))
            shown.append(f"{header_name}={value}")
    return " ".join(shown)


def terminal_width(config) -> int:
    """Columns of the terminal the reports are printed on: pytest's TerminalWriter's (it follows
    COLUMNS and the real terminal), the controller's under xdist, else the shell's or 80."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None and WORKER_WIDTH_KEY in workerinput:
        return int(workerinput[WORKER_WIDTH_KEY])
    if config.pluginmanager.has_plugin("terminalreporter"):
        return config.get_terminal_writer().fullwidth
    return shutil.get_terminal_size((80, 24)).columns


# --- failure messages ---------------------------------------------------------------------


def describe_schedule(spec: ScheduleSpec, device, elide: bool = False) -> str:
    """`delay:0 = delay(steps=8) seed 123, decisions 1x2.h.2` (decisions replay with replay:<...>).
    `elide`: shorten a long decisions string, for a failure message (see _elided)."""
    schedule = device.schedule
    if schedule is None:
        return f"{spec.label} = {spec.policy} schedule seed {spec.seed}"
    decisions = schedule.compact() or "-"
    if elide:
        decisions = _elided(decisions)
    # "schedule seed": the failure's other seed is the run's, which its replay line passes.
    return f"{spec.label} = {schedule.policy} schedule seed {schedule.seed}, decisions {decisions}"


# Decisions grow with the program (a 200-step decode takes ~10,000 characters): a failure
# message keeps the head and the tail; report.txt and the junitxml property keep all of it.
DECISIONS_HEAD, DECISIONS_TAIL = 40, 20
DECISIONS_ELIDED_OVER = 100


def _elided(decisions: str) -> str:
    if len(decisions) <= DECISIONS_ELIDED_OVER:
        return decisions
    # `[...]`: decisions are made of digits, `h`, `x` and dots, so a bare `...` would read as part of them.
    return (f"{decisions[:DECISIONS_HEAD]}[...]{decisions[-DECISIONS_TAIL:]} ({len(decisions)} characters; "
            "all of them in report.txt under --streamcheck-trace-dir and in --junitxml)")


def format_races(races, width: Optional[int] = None, config=None) -> str:
    """The race reports of a failure; under -v each access's stack follows it."""
    from ..core.hb import format_report

    return format_report(list(races), width, stack=config is not None and config.getoption("verbose") > 0)


def confirmation_text(confirmations) -> str:
    """The failure's confirmation section: per race, confirmed or not, with the values."""
    lines = ["  confirmation (--streamcheck-confirm):"]
    for c in confirmations:
        race = c.race
        lines.append(f"    {race.kind} on `{race.buffer}` ({race.first.site} -> {race.second.site}): {c.format()}")
    return "\n".join(lines)


def strike_hint(races, confirm_runs: bool) -> str:
    """The "to make them strike" line after a report whose races did not strike, offering only what
    works: --streamcheck-confirm where it can rerun the program (`confirm_runs`: a run_schedules
    program on the sim), else the race-directed delay by hand; neither where every first access is
    the host's own, which executes when issued (no schedule can hold it)."""
    from ..core.schedule import directed_delay

    for race in races:
        target = directed_delay(race)
        if target is None:
            continue
        stream, kernel = target
        delay = f"streams=[{stream!r}]" + (f", kernels=[{kernel!r}]" if kernel else "")
        by_hand = f"Device(\"sim\", policy=\"delay\", {delay}, steps=8)"
        if confirm_runs:
            return (f"  to make them strike: --streamcheck-confirm holds {race.first.describe()} until "
                    f"`{race.second.name}` ran; by hand: {by_hand}")
        return (f"  to make them strike: hold {race.first.describe()} until `{race.second.name}` ran: {by_hand} "
                "(--streamcheck-confirm needs a run_schedules program)")
    first = races[0].first
    return (f"  to make them strike: no delay can: the first access ({first.describe()}) is the host's own, which "
            "executes when issued; add the missing edge above")


def failure_text(headline: str, spec: ScheduleSpec, schedule: str, diff: Optional[str], report: str,
                 replay: str, width: Optional[int] = None, first_line_taken: int = 0) -> str:
    """The failure message. With `width`, lines are wrapped at it, the headline `first_line_taken`
    columns narrower (pytest prints the exception's name before it); the replay line stays
    whole, since it is pasted back into a shell."""
    from ..core.hb import CONTINUATION_INDENT, MIN_WRAP_WIDTH, wrap_lines

    first = f"streamcheck: {headline}"
    if width is not None:
        # Wrapped as if the exception's name were part of it, which is then cut off again.
        taken = " " * first_line_taken
        first = "\n".join(textwrap.wrap(first, max(width, MIN_WRAP_WIDTH), initial_indent=taken,
                                        subsequent_indent=CONTINUATION_INDENT, break_long_words=False,
                                        break_on_hyphens=False))[len(taken):]
    lines = [f"  schedule: {schedule or f'{spec.label} = {spec.policy} schedule seed {spec.seed}'}"]
    if diff:
        lines.append(f"  mismatch: {diff}")
    if report:
        lines.append(report)
    return "\n".join([first, wrap_lines("\n".join(lines), width), f"  replay: {replay}"])


# --- trace files of failing tests ---------------------------------------------------------


def _safe_name(nodeid: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", nodeid).strip("_")[:150] or "test"


def _write_perfetto(device, path: str) -> None:
    from ..pictures.export import write_chrome_trace

    write_chrome_trace(device, path)


def _write_png(device, path: str) -> None:
    from ..pictures.timeline import render_timeline  # imports matplotlib: only for a failing test

    render_timeline(device, path)


_TRACE_FILES = (
    # (file name, what writes it, the public function named when it fails)
    ("perfetto.json", _write_perfetto, "streamcheck.export.write_chrome_trace"),
    ("timeline.png", _write_png, "streamcheck.timeline.render_timeline"),
)


@dataclass(frozen=True)
class TraceFiles:
    """Where write_trace put a failing test's files, or why it could not."""

    directory: str
    problem: str = ""  # the OSError's words when the directory could not be written


def write_trace(config, nodeid: str, device) -> Optional[TraceFiles]:
    """With --streamcheck-trace-dir: DIR/<node id>/ gets the failing run's trace.json,
    report.txt, perfetto.json for ui.perfetto.dev and timeline.png.

    The directory appears complete or not at all, even if the run is killed while writing
    (atomic_files.write_directory); a directory that cannot be written is a note in the
    failure, never an error in place of the test's own."""
    trace_dir = config.stash[SETTINGS_KEY].trace_dir
    if not trace_dir or device is None:
        return None
    from ..atomic_files import write_directory, write_text  # only for a failing test

    out = os.path.join(trace_dir, _safe_name(nodeid))

    def fill(folder: str) -> None:
        write_text(os.path.join(folder, "trace.json"), device.trace.to_json())
        notes = [device.report()]
        schedule = device.schedule
        if schedule is not None:
            notes.append(f"schedule: {schedule.policy} schedule seed {schedule.seed}, "
                         f"decisions {schedule.compact() or '-'}")
        for filename, write, name in _TRACE_FILES:
            try:
                write(device, os.path.join(folder, filename))
            except Exception as exc:  # an exporter problem must not hide the test's own failure
                notes.append(f"{filename} not written: {name} raised {type(exc).__name__}: {exc}")
        write_text(os.path.join(folder, "report.txt"), "\n".join(notes) + "\n")

    try:
        os.makedirs(trace_dir, exist_ok=True)
        write_directory(out, fill)
    except OSError as exc:
        return TraceFiles(out, f"{exc.strerror or exc}: {exc.filename}" if exc.filename else str(exc))
    return TraceFiles(out)


def trace_note(written: Optional[TraceFiles]) -> str:
    """The line a failure message gets when --streamcheck-trace-dir was given."""
    if not written:
        return ""
    if written.problem:
        return (f"\n  trace files: could not be written to {written.directory}/ ({written.problem}); "
                "give --streamcheck-trace-dir a writable directory")
    out = written.directory
    return (f"\n  trace files: {out}/ (perfetto.json for ui.perfetto.dev, timeline.png, trace.json, "
            "report.txt)")


# --- test reports -------------------------------------------------------------------------


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """Races into the test's report; its findings into the `streamcheck` property."""
    report = yield
    found = item.stash.get(FINDINGS_KEY, None)
    if found is None or call.when != "call":
        return report
    config = item.config
    device = found.device
    if device is not None:
        found.add_races(device.races)
        found.schedule = found.schedule or describe_schedule(found.spec, device)
    recording = found.recording
    if recording is not None and found.check != "off":
        found.add_races(recording.races)
    if config.stash[SETTINGS_KEY].audit_syncs and found.sync_audit is None:
        recorded = device if device is not None else recording  # run_schedules audited its reference run
        if recorded is not None:
            from ..analyses.sync_audit import audit

            found.sync_audit = audit(recorded.trace)
    if found.sync_audit is not None:
        report.sections.append(("streamcheck sync audit", found.sync_audit.format(terminal_width(config))))
    hazards = [h for source in (device, recording) if source is not None for h in getattr(source, "hazards", ())]
    if hazards and found.check != "off":  # said, never failing: nothing reused the memory (core.hb.Hazard)
        from ..core.hb import format_hazards

        report.sections.append(("streamcheck free hazards", format_hazards(hazards, terminal_width(config))))
    from ..core.fast import handover_notice

    handed = [line for line in (handover_notice(getattr(source, "checker", None)) for source in (device, recording))
              if line]
    if handed:  # a stream capture, a graph or peer access: the Python checker took the rest of the feed
        report.sections.append(("streamcheck checker", "\n".join(handed)))
    races = list(found.races.values())
    check = found.check
    width = terminal_width(config)
    ours = call.excinfo is not None and call.excinfo.errisinstance(ScheduleFailure)
    if recording is not None and races and report.passed:
        report.outcome = "failed"
        report.longrepr = "\n".join([
            f"streamcheck: the happens-before checker found {len(races)} race{'s' if len(races) != 1 else ''} "
            "in the test's GPU work (streamcheck_gpu)",
            f"  {recording.summary()}", format_races(races, width, config), f"  replay: {found.replay}"])
    elif device is not None and races and check == "on" and report.passed:
        # The race did not strike on this schedule, but nothing orders the accesses.
        report.outcome = "failed"
        if config.stash[SETTINGS_KEY].confirm:
            extra = ("  confirmation (--streamcheck-confirm): not attempted: a streamcheck_device test's body cannot "
                     "be rerun from the start; write it as a run_schedules program to have its races confirmed")
        else:
            extra = strike_hint(races, confirm_runs=False)  # a test body cannot be rerun from the start
        report.longrepr = failure_text(
            f"the happens-before checker found {len(races)} race{'s' if len(races) != 1 else ''} "
            "(streamcheck_device: values are the test's to check)",
            found.spec, describe_schedule(found.spec, device, elide=True), None,
            format_races(races, config=config) + "\n" + extra, found.replay, width)
    elif races and not ours:
        # Races beside some other outcome (warn mode, or the test failed for its own reason).
        text = format_races(races, width, config)
        if report.failed and hasattr(report.longrepr, "addsection"):
            report.longrepr.addsection(RACES_SECTION, text)  # in the failure: --junitxml keeps it
        else:
            report.sections.append((RACES_SECTION, text))
    if device is not None and report.failed:
        written = write_trace(config, item.nodeid, device)
        if written:
            report.sections.append(("streamcheck trace", trace_note(written).strip()))
    found_something = bool(races or found.wrong)
    # JSON, not a dict: --junitxml writes each property with str(), and JSON is what a CI
    # reads back. Call sites are relative to the rootdir, as pytest's node ids are.
    entry = (PROPERTY, json.dumps({
        "races": [race.to_dict(str(config.rootpath)) for race in races],
        "schedules": found.schedules, "wrong": found.wrong,
        **({"sync_audit": found.sync_audit.to_dict(str(config.rootpath))} if found.sync_audit is not None else {}),
        "schedule": found.schedule if found_something else "",
        "replay": found.replay if found_something else ""}))
    report.user_properties.append(entry)  # for the summary (on the xdist controller too)
    # and on the item, as record_property does: --junitxml reads the teardown report's
    # properties, which pytest copies from the item after this.
    item.user_properties.append(entry)
    return report


class _Summary:
    """Collects each test's findings from its report (on the xdist controller too:
    user_properties travel with the report) and prints them at the end."""

    def __init__(self, config):
        self.config = config
        self.rows: list = []  # (node id, outcome, findings) in report order
        self.unshown: dict = {}  # node id -> the race reports of a test that passed (warn mode)

    def pytest_runtest_logreport(self, report) -> None:
        if report.when != "call":
            return
        if report.passed:  # a failure shows its races; a pass shows them only under -rP: here they are
            self.unshown.update({report.nodeid: text for name, text in report.sections if name == RACES_SECTION})
        for name, value in report.user_properties:
            if name == PROPERTY and isinstance(value, str):
                self.rows.append((report.nodeid, report.outcome, json.loads(value)))

    def pytest_terminal_summary(self, terminalreporter) -> None:
        header = _show_header(self.config)  # the xdist controller's: it collected nothing
        if not self.rows and not header:
            return
        terminalreporter.section("streamcheck")
        for line in header:
            terminalreporter.line(line)
        if not self.rows:
            return
        from ..core.hb import wrap_lines

        width = terminal_width(self.config)
        found = [row for row in self.rows if row[2]["races"] or row[2]["wrong"]]
        for nodeid, outcome, value in found:
            parts = []
            races = value["races"]
            if races:
                kinds = sorted({f"{race['kind']} on {race['buffer']}" for race in races})
                parts.append(f"{len(races)} race{'s' if len(races) != 1 else ''} ({', '.join(kinds)})")
            if value["wrong"]:
                parts.append(f"{value['wrong']} of {value['schedules']} schedules gave wrong values")
            terminalreporter.line(wrap_lines(f"{outcome.upper()} {nodeid}: {'; '.join(parts)}", width))
            if value["replay"]:
                terminalreporter.line(f"    replay: {value['replay']}")  # whole: it is pasted back
            if nodeid in self.unshown:
                terminalreporter.line(self.unshown[nodeid])
        for nodeid, outcome, value in self.rows:
            audited = value.get("sync_audit")
            if audited is not None:  # one line per test; the table is in the test's report (-rA shows it)
                terminalreporter.line(wrap_lines(f"SYNCS {nodeid}: {audited['summary']}", width))
        racy = sum(1 for row in found if row[2]["races"])
        schedules = sum(row[2]["schedules"] for row in self.rows)
        tests = len(self.rows)
        terminalreporter.line(wrap_lines(
            f"streamcheck: {tests} test{'s' if tests != 1 else ''}, {schedules} "
            f"schedule{'s' if schedules != 1 else ''}, races found in {racy} test{'s' if racy != 1 else ''}; "
            f"--streamcheck-seed={base_seed(self.config)}", width))
