"""The trace: what a stream program asked the device to do, in host issue order.

Pure data. Backends append operations here as the program issues them; the
happens-before checker (hb.py), the exporters and the reports read it. Nothing in
this module knows about CuPy, torch or the simulator.

Ids are small integers chosen by whoever records the trace (the device API).
Every operation carries the host thread that issued it and the Python call site.
"""
from __future__ import annotations

import enum
import json
import os
import sys
import sysconfig
import threading
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Optional, Union


def _parse_choice(cls, value, what: str):
    """A member of the str enum `cls` from itself or its value ("non-blocking" works too)."""
    if isinstance(value, cls):
        return value
    try:
        return cls(str(value).replace("-", "_"))
    except ValueError:
        choices = ", ".join(member.value for member in cls)
        raise ValueError(f"unknown {what} {value!r}; choose one of: {choices}") from None


class StreamKind(str, enum.Enum):
    """How a stream synchronizes with the legacy default stream (CUDA programming guide)."""

    LEGACY = "legacy"  # stream 0 / cudaStreamLegacy
    PER_THREAD = "per_thread"  # cudaStreamPerThread: behaves like a blocking stream
    BLOCKING = "blocking"  # cudaStreamCreate / cudaStreamDefault
    NON_BLOCKING = "non_blocking"  # cudaStreamNonBlocking: never syncs with legacy

    @property
    def joins_legacy(self) -> bool:
        """Blocking and per-thread default streams synchronize with the legacy stream."""
        return self in (StreamKind.BLOCKING, StreamKind.PER_THREAD)

    @classmethod
    def parse(cls, value: Union[str, "StreamKind"]) -> "StreamKind":
        return _parse_choice(cls, value, "stream kind")


def stream_label(kind: StreamKind, name: str, stream: int, thread: int) -> str:
    """How reports name a stream: "stream A", the legacy default stream, or a thread's own.
    With several devices in use the checker adds the device (device_label)."""
    if kind is StreamKind.LEGACY:
        return name or "legacy default stream"
    if kind is StreamKind.PER_THREAD:
        return name or f"per-thread default stream of thread {thread}"
    return f"stream {name}" if name else f"stream{stream}"


def device_label(label: str, device: int) -> str:
    """A stream's label with its device, as reports name it when more than one device is in use."""
    return f"{label} (cuda:{device})"


@dataclass(frozen=True)
class SiteSettings:
    """What every call-site resolver of the process (the device API's and each recording's) takes
    for the user's code, and how reports print its paths. Set with set_site_settings: the pytest
    plugin (`--streamcheck-library`, the rootdir) and `streamcheck run --library` do."""

    libraries: tuple = ()  # absolute path prefixes of the user's own wrappers: library frames, like torch's
    root: Optional[str] = None  # report paths relative to this directory; None: the working directory
    depth: int = 8  # frames of stack kept per operation (JSON, Perfetto args, -v)


_site_settings = SiteSettings()
_settings_version = 0  # bumped by set_site_settings: resolvers reclassify their files


def site_settings() -> SiteSettings:
    return _site_settings


def set_site_settings(settings: SiteSettings) -> SiteSettings:
    """Make `settings` the process's; returns the previous ones, for the caller to restore."""
    global _site_settings, _settings_version
    if not isinstance(settings.depth, int) or settings.depth < 1:
        raise ValueError(f"call-site depth must be an integer >= 1, got {settings.depth!r}")
    previous = _site_settings
    # A directory as a prefix that ends in a separator: pkg1 must not take in pkg10's files.
    libraries = tuple(os.path.join(p, "") if os.path.isdir(p) else p for p in map(os.path.abspath, settings.libraries))
    _site_settings = replace(settings, libraries=libraries)
    _settings_version += 1
    return previous


def site_path(site: "CallSite", root: Optional[str] = None) -> str:
    """`path:line` with the path relative to `root` (default: the settings' root, else the working
    directory) when the file lies under it, else absolute: a basename alone is ambiguous in a
    repository with two files of that name, and a relative path is what editors and CI resolve."""
    site = site._resolved()
    file = site._file
    if file.startswith("<"):  # <string>, <stdin>, <unknown>: no file to point at
        return f"{file}:{site._line}"
    if root is None:
        root = _site_settings.root
    # Every report names its sites, a race in a loop thousands of times over a handful of files:
    # the path is resolved once per file (abspath, commonpath and a walk of the file system cost
    # far more than the lookup). The working directory is in the key where the answer depends on
    # it: no root to be relative to, or a relative file name.
    cwd = None if root is not None and os.path.isabs(file) else os.getcwd()
    key = (file, root, cwd)
    path = _report_paths.get(key)
    if path is None:
        path = _report_paths[key] = _report_path(file, root if root is not None else cwd)
    return f"{path}:{site._line}"


_report_paths: dict = {}  # (file, root, working directory or None) -> the file as reports name it


def _report_path(file: str, root: str) -> str:
    """The file of site_path: an installed library's by its package path, one under `root`
    relative to it, else by its package path (_package_path) or absolute."""
    root = os.path.abspath(root)
    path = os.path.abspath(file)
    # An installed library's file by its package path (torch/_ops.py), however deep the environment.
    installed = [d for d in _installed_dirs() if path.startswith(d)]
    if installed:
        return os.path.relpath(path, max(installed, key=len))
    if os.path.commonpath([root, path]) == root:
        return os.path.relpath(path, root)
    return _package_path(path)


def _package_path(path: str) -> str:
    """A file of a package outside the root (an editable install, a checkout on sys.path) by its
    package path (flashnorm_kernels/pipeline.py), as an installed one is; else the absolute path."""
    top = os.path.dirname(path)
    if not os.path.exists(os.path.join(top, "__init__.py")):
        return path
    while os.path.exists(os.path.join(os.path.dirname(top), "__init__.py")):
        top = os.path.dirname(top)
    return os.path.relpath(path, os.path.dirname(top))


def _line_at(code, offset: int) -> int:
    """The source line of the instruction at byte `offset` of `code` (what frame.f_lineno says)."""
    for start, stop, line in code.co_lines():
        if start <= offset < stop:
            return line if line is not None else code.co_firstlineno
    return code.co_firstlineno


class CallSite:
    """Where an operation was issued. `file`, `line`, `function`: the user's frame, the first one
    outside streamcheck and the libraries (torch, CuPy, Triton, transformers, the standard library,
    the user's own wrappers of SiteSettings.libraries). `innermost`: the frame the call left the
    program from (a library's line), when it is another one; None otherwise. `stack`: the frames
    from the innermost outward, each a CallSite without a stack of its own.

    Sites compare by their user frame (as a line of the user's program); `place` adds the innermost
    frame: two call paths to one library line are two places (two reports), the frames in between
    are context. A resolver's site keeps
    (code object, instruction offset) pairs and finds files and lines only when first read, so
    recording pays for a walk of the frames, and only a report for their lines."""

    __slots__ = ("_file", "_line", "_function", "_innermost", "_stack", "_frames", "_codes", "_hash", "_place")

    def __init__(self, file: str, line: int, function: str = "", innermost: Optional["CallSite"] = None,
                 stack: tuple = ()):
        self._file, self._line, self._function = file, line, function
        self._innermost, self._stack = innermost, tuple(stack)
        self._frames = None
        self._codes = ()
        self._hash = None
        self._place = None

    @classmethod
    def captured(cls, frames: tuple, user: int) -> "CallSite":
        """A site of (code, offset) pairs, innermost first; `user` indexes the user's frame."""
        site = cls.__new__(cls)
        site._frames = (frames, user)
        # A resolver's table is keyed by these codes' ids: held as long as the site is, so no later
        # code object (another program's, run in this process after this one's died) takes an id.
        site._codes = frames
        site._hash = None
        site._place = None
        return site

    def _resolve(self) -> None:
        frames, user = self._frames
        stack = tuple(CallSite(code.co_filename, _line_at(code, offset), code.co_name) for code, offset in frames)
        self._file, self._line, self._function = stack[user]._file, stack[user]._line, stack[user]._function
        self._innermost = stack[0] if user != 0 else None
        self._stack = stack[:max(_site_settings.depth, 1)]
        self._frames = None

    file = property(lambda self: self._resolved()._file)
    line = property(lambda self: self._resolved()._line)
    function = property(lambda self: self._resolved()._function)
    innermost = property(lambda self: self._resolved()._innermost)  # Optional[CallSite]
    stack = property(lambda self: self._resolved()._stack)

    def _resolved(self) -> "CallSite":
        """Itself, its frames turned into files and lines on first read."""
        if self._frames is not None:
            self._resolve()
        return self

    @property
    def place(self) -> tuple:
        """(file, line, function) of the user's frame, then of the innermost frame if there is one.
        Kept once built: the checker reads it for every occurrence of a race."""
        place = self._place
        if place is None:
            inner = self._resolved()._innermost
            place = self._place = (self._file, self._line, self._function) + (() if inner is None else inner.place)
        return place

    def __eq__(self, other) -> bool:
        if self is other:
            return True
        if not isinstance(other, CallSite):
            return NotImplemented
        return (self.file, self.line, self.function) == (other.file, other.line, other.function)

    def __hash__(self) -> int:
        if self._hash is None:
            self._hash = hash((self.file, self.line, self.function))
        return self._hash

    def __repr__(self) -> str:
        inner = f", innermost={self.innermost!r}" if self.innermost is not None else ""
        return f"CallSite({self.file!r}, {self.line}, {self.function!r}{inner})"

    def __str__(self) -> str:  # short, for messages beside a traceback; reports use site_path
        return f"{os.path.basename(self.file)}:{self.line}"

    def __reduce__(self):  # code objects do not pickle: a copy carries the resolved frames
        return CallSite, (self.file, self.line, self.function, self.innermost, self.stack)

    def to_dict(self, root: Optional[str] = None) -> dict:
        """JSON-ready: `site` (path:line, see site_path), `function`, `innermost` (the same, or None)
        and `stack` (a list of them, innermost first)."""
        def frame(f: "CallSite") -> dict:
            return {"site": site_path(f, root), "function": f.function}

        inner = self.innermost
        return dict(frame(self), innermost=None if inner is None else frame(inner),
                    stack=[frame(f) for f in self.stack])


UNKNOWN_SITE = CallSite("<unknown>", 0)

MACHINERY, LIBRARY, USER = 0, 1, 2  # what a frame's file is to a resolver
FORWARDING = 3  # what a library's forwarding wrapper's frame is to a resolver's walk (code_kind): skipped
# Packages whose frames are libraries wherever they are installed (found once imported).
LIBRARY_PACKAGES = ("torch", "cupy", "cupyx", "cupy_backends", "triton", "transformers")
_installed: Optional[tuple] = None
# Decorator wrappers of a library, by file and function name: their frames only forward a call,
# so they are skipped like streamcheck's own (torch wraps every dispatch mode's
# __torch_dispatch__ in torch._disable_dynamo, whose frames would read as the user's library call).
_WRAPPERS: dict = {}  # co_filename -> frozenset of function names


def skip_wrapper_frames(filename: str, *names: str) -> None:
    """Frames of functions `names` in `filename` (a library's forwarding wrappers) are not call sites."""
    global _settings_version
    known = _WRAPPERS.get(filename, frozenset())
    if not known.issuperset(names):
        _WRAPPERS[filename] = known | frozenset(names)
        _settings_version += 1  # resolvers classify their frames again (the native walk keeps each code's kind)


def _forwards(code) -> bool:
    names = _WRAPPERS.get(code.co_filename)
    return names is not None and code.co_name in names


def _installed_dirs() -> tuple:
    """The standard library's and the installed packages' directories."""
    global _installed
    if _installed is None:
        paths = sysconfig.get_paths()
        _installed = tuple(os.path.join(os.path.abspath(paths[k]), "")
                           for k in ("stdlib", "platstdlib", "purelib", "platlib"))
    return _installed


def _library_prefixes() -> tuple:
    """The standard library, installed packages, and the LIBRARY_PACKAGES imported so far
    (an editable install lives elsewhere)."""
    found = []
    for name in LIBRARY_PACKAGES:
        file = getattr(sys.modules.get(name), "__file__", None)
        if file:
            found.append(os.path.join(os.path.dirname(os.path.abspath(file)), ""))
    return _installed_dirs() + tuple(found)


def reads_frames(frames_here) -> bool:
    """Whether a native reading of this thread's frames is sys._getframe()'s: `frames_here()` gives
    [(code, offset), ...] innermost first (its own Python wrapper's frames first, if it has any). The
    same code objects, and the same offsets in every frame but this one (still running)."""
    read = frames_here()
    frame, expected = sys._getframe(), []
    while frame is not None:
        expected.append((frame.f_code, frame.f_lasti))
        frame = frame.f_back
    while read and read[0][0] is not expected[0][0]:
        read = read[1:]
    return (len(read) == len(expected) and all(a[0] is b[0] for a, b in zip(read, expected))
            and read[1:] == expected[1:])


def built_from(module, *names: str) -> bool:
    """Whether a core extension `module` was built from the sources `names` of core/native as they are (setup.py
    hashes them into its SOURCE_SHA256): not so for an editable install not rebuilt since one changed. True where
    the sources are not installed beside it."""
    import hashlib

    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "native")
    sources = [os.path.join(here, name) for name in names]
    if not all(map(os.path.exists, sources)):
        return True
    digest = hashlib.sha256()
    for source in sources:
        with open(source, "rb") as f:
            digest.update(f.read())
    return getattr(module, "SOURCE_SHA256", None) == digest.hexdigest()


def _native_walker():
    """The Walker class of the core's native call-site walk (native/sites.cpp), or None where the
    resolvers walk in Python: STREAMCHECK_NATIVE_SITES=0, not built, built from other sources (an
    editable install not rebuilt), or reading this Python's frames otherwise than Python does."""
    import importlib

    if os.environ.get("STREAMCHECK_NATIVE_SITES") == "0":
        return None
    try:
        module = importlib.import_module(__package__ + "._sites_native")
    except ImportError:
        return None
    if not built_from(module, "sites.cpp", "frames.h"):
        return None
    return module.Walker if reads_frames(module.frames_here) else None


class _HeldSite:
    __slots__ = ("state", "site", "attr", "previous")

    def __init__(self, state, site, attr: str = "site"):
        self.state, self.site, self.attr = state, site, attr

    def __enter__(self):
        self.previous = getattr(self.state, self.attr, None)
        setattr(self.state, self.attr, self.site)

    def __exit__(self, *exc):
        setattr(self.state, self.attr, self.previous)


class SiteResolver:
    """The site of the call being recorded, from the frames above the caller: those under
    `internal` (path prefixes: the recording machinery) are skipped; library frames come next,
    then the user's frame; the walk goes on through the user's callers and stops at the first
    frame that is not the user's again (pytest, runpy, streamcheck's runner) or at
    SiteSettings.depth frames. It runs once per recorded operation, so it keeps only (code
    object, offset) pairs, keyed by the code objects' ids (the site holds its codes, so an id
    in the table stays theirs), and caches what each file is by file name (whose hash Python
    caches; a code object's it recomputes)."""

    def __init__(self, internal, libraries=()):
        self.internal = tuple(internal)
        self.libraries = tuple(libraries)  # more library prefixes (a recording's Gpu knows its own)
        self._held = threading.local()  # .site: what this thread's calls resolve to while held
        self._kinds: dict = {}  # file name -> MACHINERY, LIBRARY or USER
        self._sites: dict = {}  # (id(code), offset, ...) innermost first -> CallSite
        self._version = _settings_version
        # __call__'s walk in C where it is built (native/sites.cpp; None: the walk in Python): stack ids, each
        # turned into its site once.
        self.walker = _Walker(self.code_kind, _site_settings.depth) if _Walker is not None else None
        self._by_stack: dict = {0: (UNKNOWN_SITE, False)}  # stack id -> (site, whether it has a user frame)

    def kind_of(self, filename: str) -> int:
        """What a frame of `filename` is to this resolver: MACHINERY, LIBRARY or USER."""
        if self._version != _settings_version:  # other libraries: other user frames
            self._kinds.clear()
            self._sites.clear()
            if self.walker is not None:
                self.walker.reset(_site_settings.depth)
                self._by_stack = {0: (UNKNOWN_SITE, False)}
            self._version = _settings_version
        kind = self._kinds.get(filename)
        if kind is None:
            kind = self._kinds[filename] = self._classify(filename)
        return kind

    def _classify(self, filename: str) -> int:
        if filename.startswith("<"):  # <frozen importlib._bootstrap> is the standard library; <string> the user's
            return LIBRARY if filename.startswith("<frozen ") else USER
        path = os.path.abspath(filename)
        if path.startswith(self.internal):
            return MACHINERY
        if path.startswith(self.libraries + _site_settings.libraries) or path.startswith(_library_prefixes()):
            return LIBRARY
        return USER

    def code_kind(self, code) -> int:
        """What a frame running `code` is to this resolver's walk: MACHINERY, LIBRARY, USER, or
        FORWARDING (a library's wrapper that only forwards a call, skipped like MACHINERY). For a
        walk made elsewhere: the native recorder's (record/native/observer.cpp), which asks once
        per code object."""
        kind = self.kind_of(code.co_filename)
        if kind == LIBRARY and _WRAPPERS and _forwards(code):
            return FORWARDING
        return kind

    def site_of(self, frames: tuple, user: int) -> "CallSite":
        """The site of a walk made elsewhere by __call__'s rule: `frames` the (code object, offset)
        pairs it kept, innermost first, `user` the index of the user's frame (-1: none). The same
        CallSite that __call__ gives for that call path (one per path, lines resolved when first read)."""
        if self._version != _settings_version:
            self.kind_of("")
        if not frames:
            return UNKNOWN_SITE
        key = tuple(x for code, offset in frames for x in (id(code), offset))
        site = self._sites.get(key)
        if site is None:
            site = self._sites[key] = CallSite.captured(tuple(frames), max(user, 0))
        return site

    def hold(self, site: "CallSite"):
        """This thread's calls resolve to `site` until release(what hold returned): a recorder
        turning records made earlier into trace records (the native observer's, drained later) names
        their own site. The cheap form of held(), for one record at a time."""
        state = self._held
        previous = getattr(state, "site", None)
        state.site = site
        return previous

    def release(self, previous) -> None:
        self._held.site = previous

    def held(self, site: "CallSite") -> "_HeldSite":
        """`with resolver.held(site):` this thread's calls resolve to `site`: a layer that turns one
        user call into several recorded calls (an emulated operator: allocate, launch, free)
        resolves the user's frame once."""
        return _HeldSite(self._held, site)

    def fallback(self, site: "CallSite") -> "_HeldSite":
        """`with resolver.fallback(site):` a call from this thread with no user frame on its stack
        resolves to `site` (a tensor freed as a program returns, under the runner that called it)."""
        return _HeldSite(self._held, site, "fallback")

    def __call__(self, depth_limit: int = 64) -> CallSite:
        held = getattr(self._held, "site", None)
        if held is not None:
            return held
        if self._version != _settings_version:
            self.kind_of("")
        if self.walker is not None:  # the walk below, in C: the frames above this one
            stack = self.walker.walk(1, depth_limit)
            found = self._by_stack.get(stack)
            if found is None:
                frames, user = self.walker.stack(stack)
                found = self._by_stack[stack] = (self.site_of(frames, user), user >= 0)
            if not found[1]:
                fallback = getattr(self._held, "fallback", None)
                if fallback is not None:
                    return fallback
            return found[0]
        kinds = self._kinds
        frame = sys._getframe(1)
        # The hot path: per frame one dictionary lookup and two ints kept; no line numbers.
        key = []
        keep = key.append
        user = -1  # index of the user's frame among those kept
        for _ in range(depth_limit):  # streamcheck's frames, then the libraries', up to the user's
            if frame is None:
                break
            code = frame.f_code
            kind = kinds.get(code.co_filename)
            if kind is None:
                kind = self.kind_of(code.co_filename)
            if kind == LIBRARY and _WRAPPERS and _forwards(code):
                kind = MACHINERY
            if kind:
                keep(id(code))
                keep(frame.f_lasti)
                if kind == USER:
                    user = len(key) // 2 - 1
                    break
            frame = frame.f_back
        if user >= 0:  # the user's callers, while they are the user's (not pytest's, runpy's, ours)
            frame = frame.f_back
            for _ in range(_site_settings.depth - 1):
                if frame is None:
                    break
                code = frame.f_code
                kind = kinds.get(code.co_filename)
                if kind is None:
                    kind = self.kind_of(code.co_filename)
                if kind == LIBRARY and _WRAPPERS and _forwards(code):  # e.g. torch.compile's: its caller is the user's
                    frame = frame.f_back
                    continue
                if kind != USER:
                    break
                keep(id(code))
                keep(frame.f_lasti)
                frame = frame.f_back
        if user < 0:
            fallback = getattr(self._held, "fallback", None)
            if fallback is not None:
                return fallback
        if not key:
            return UNKNOWN_SITE
        key = tuple(key)
        site = self._sites.get(key)
        if site is None:  # the first time this call path is seen
            site = self._sites[key] = self._capture(len(key) // 2, max(user, 0))
        return site

    def _capture(self, count: int, user: int) -> CallSite:
        """The site of the `count` frames the walk in __call__ kept (it skipped machinery only)."""
        frame = sys._getframe(2)
        frames = []
        while frame is not None and len(frames) < count:
            if self._kinds.get(frame.f_code.co_filename) != MACHINERY and not _forwards(frame.f_code):
                frames.append((frame.f_code, frame.f_lasti))
            frame = frame.f_back
        return CallSite.captured(tuple(frames), user)


_Walker = _native_walker()


@dataclass(frozen=True)
class Range:
    """Bytes [start, stop) of one allocation."""

    buffer: int
    start: int
    stop: int

    def overlaps(self, other: "Range") -> bool:
        return self.buffer == other.buffer and self.start < other.stop and other.start < self.stop


# --- operations -----------------------------------------------------------------------------
# Each is frozen; `thread` is the issuing host thread, `site` the user's call site.


@dataclass(frozen=True)
class Op:
    thread: int
    site: CallSite


@dataclass(frozen=True)
class ThreadStart(Op):
    """`thread` starts; everything its parent did so far happens before it."""

    parent: Optional[int] = None


@dataclass(frozen=True)
class ThreadJoin(Op):
    """`thread` joins `child`: everything the child did happens before what follows."""

    child: int = 0


# Host threads' own hand-offs (threading.Event, queue.Queue, locks, Condition, Barrier): one
# thread hands its work over through a channel, another takes it over. A channel is a number
# the recorder picks: one per Event (until it is cleared), per queued item, per lock, per
# Condition, per barrier generation.


@dataclass(frozen=True)
class HandOff(Op):
    """`thread` hands over through `channel` (Event.set, a queue put, a lock's release,
    Condition.notify, arriving at a barrier): everything it did so far happens before a later
    TakeOver of `channel`. `what` names the call ("Event.set") for people."""

    channel: int = 0
    what: str = ""


@dataclass(frozen=True)
class TakeOver(Op):
    """`thread` takes over what every HandOff of `channel` so far handed over (an Event.wait
    that returned True, the get that returned a put's item, a lock's acquire, a Condition.wait
    that was woken, passing a barrier). A channel nobody handed off through orders nothing."""

    channel: int = 0
    what: str = ""


@dataclass(frozen=True)
class StreamCreate(Op):
    """A stream of `device` (the device index, as in cuda:N). Each device has its own legacy
    default stream; blocking streams synchronize only with their own device's."""

    stream: int = 0
    kind: StreamKind = StreamKind.NON_BLOCKING
    name: str = ""
    device: int = 0


@dataclass(frozen=True)
class EventCreate(Op):
    event: int = 0
    name: str = ""


@dataclass(frozen=True)
class EventDestroy(Op):
    event: int = 0


@dataclass(frozen=True)
class EventRecord(Op):
    event: int = 0
    stream: int = 0


@dataclass(frozen=True)
class StreamWait(Op):
    """cudaStreamWaitEvent: later work on `stream` waits for the event's state *now*."""

    stream: int = 0
    event: int = 0


# `cause` on the host synchronizations: the call that synchronized, when it is not the plain
# synchronize() (a host read such as "ndarray.get" or ".item()"); the sync audit names it.


@dataclass(frozen=True)
class StreamSync(Op):
    stream: int = 0
    cause: str = ""


@dataclass(frozen=True)
class EventSync(Op):
    event: int = 0
    cause: str = ""


@dataclass(frozen=True)
class DeviceSync(Op):
    """cudaDeviceSynchronize of `device`: orders the host after that device's streams only."""

    device: int = 0
    cause: str = ""


@dataclass(frozen=True)
class StreamQuery(Op):
    """cudaStreamQuery (`Stream.query()`, CuPy's `stream.done`): `done` is what it returned. A query
    that returned done orders the host after everything issued to the stream so far, as a
    synchronize would; one that returned not-done orders nothing."""

    stream: int = 0
    done: bool = False


@dataclass(frozen=True)
class EventQuery(Op):
    """cudaEventQuery (`Event.query()`, CuPy's `event.done`): done orders the host after the work the
    event captured (at once for a never-recorded event, which orders nothing); not-done orders nothing."""

    event: int = 0
    done: bool = False


# The name of the events torch's caching allocator records for `tensor.record_stream(s)` (the sim's
# emulated allocator names them so): their queries are the allocator's, made before it hands a freed
# block out again, never the program's.
RECORD_STREAM_EVENT = "record_stream"


@dataclass(frozen=True)
class PeerAccess(Op):
    """cudaDeviceEnablePeerAccess: kernels on `device` may access memory of `peer` from now on
    (one direction only). Not a synchronization. Copies between devices never need it (CUDA
    stages them through the host); a kernel touching another device's memory without it faults."""

    device: int = 0
    peer: int = 0


@dataclass(frozen=True)
class Alloc(Op):
    """`nbytes` of memory on `device`. `reuses`: Ranges of freed buffers whose bytes a pool hands
    to this allocation (the caching allocator decides that on the host, so the recorder sees it
    as it happens); `stream`: the stream whose pool handed them out, whose later work the new
    owner's is ordered after. A use of those bytes still pending from before their free, not
    ordered before this allocation, is a FREE race (see Free)."""

    buffer: int = 0
    nbytes: int = 0
    name: str = ""
    device: int = 0
    stream: Optional[int] = None
    reuses: tuple = ()


@dataclass(frozen=True)
class Free(Op):
    """Return memory for reuse. With a stream it is stream-ordered (pool allocators): the pool
    hands the bytes to the next allocation on that stream. `also`: streams whose work issued so
    far is ordered before the reuse too (torch's `tensor.record_stream(s)`: the caching allocator
    waits for an event it records on each such stream at the free). `pool`: the allocator, for
    the report's fix ("torch" suggests record_stream).

    A free is not a reuse: a use still pending on another stream corrupts nothing until an
    allocation gets the bytes (Alloc.reuses) before that use is ordered before it; that is the
    FREE race, and a pending use at a free whose bytes nothing reuses in the run is a hazard
    (Checker.hazards). `strict`: any allocation may get the bytes as soon as the free returns,
    so a pending use is a FREE race at the free itself (asked for with --strict-free, and the
    rule where the recorder cannot see which allocation gets freed bytes)."""

    buffer: int = 0
    stream: Optional[int] = None
    also: tuple = ()
    pool: str = ""
    strict: bool = False


@dataclass(frozen=True)
class Launch(Op):
    stream: int = 0
    name: str = ""
    reads: tuple = ()
    writes: tuple = ()


class CopyKind(str, enum.Enum):
    H2D = "H2D"
    D2H = "D2H"
    D2D = "D2D"
    PEER = "P2P"  # between two devices (cudaMemcpyPeerAsync): reads src's device, writes dst's


@dataclass(frozen=True)
class Copy(Op):
    """An async copy: an access on its stream like a kernel (device side only)."""

    stream: int = 0
    kind: CopyKind = CopyKind.D2D
    src: Optional[Range] = None  # None for host memory
    dst: Optional[Range] = None

    @property
    def reads(self) -> tuple:
        return (self.src,) if self.src is not None else ()

    @property
    def writes(self) -> tuple:
        return (self.dst,) if self.dst is not None else ()

    @property
    def name(self) -> str:
        return f"copy {self.kind.value}"


@dataclass(frozen=True)
class HostAccess(Op):
    """The host reads or writes device memory directly (mapped memory, or after a sync)."""

    reads: tuple = ()
    writes: tuple = ()
    name: str = "host access"


@dataclass(frozen=True)
class ImplicitSync(Op):
    """Something that often *behaves* like a sync but CUDA does not promise it is one:
    first cuBLAS call, lazy module loading, memory-pool growth (cudaMalloc), a
    synchronous copy from pageable memory. Recorded for the timeline; the checker
    deliberately draws no edge from it."""

    reason: str = ""


class CaptureMode(str, enum.Enum):
    """cudaStreamCaptureMode: which other threads' unsafe calls a capture forbids."""

    GLOBAL = "global"
    THREAD_LOCAL = "thread_local"
    RELAXED = "relaxed"

    @classmethod
    def parse(cls, value: Union[str, "CaptureMode"]) -> "CaptureMode":
        return _parse_choice(cls, value, "capture mode")


@dataclass(frozen=True)
class CaptureBegin(Op):
    """cudaStreamBeginCapture: work issued to `stream` (and to streams that fork from it
    through events) is recorded into graph `graph` instead of executing."""

    stream: int = 0
    graph: int = 0
    mode: CaptureMode = CaptureMode.GLOBAL


@dataclass(frozen=True)
class CaptureEnd(Op):
    """cudaStreamEndCapture on the stream that began the capture."""

    stream: int = 0
    graph: int = 0


@dataclass(frozen=True)
class GraphLaunch(Op):
    """cudaGraphLaunch: the whole captured graph runs as one unit of work on `stream`."""

    stream: int = 0
    graph: int = 0


StreamOp = (EventRecord, StreamWait, Launch, Copy)


@dataclass
class Trace:
    """Operations in host issue order, plus the names the reports need."""

    ops: list = field(default_factory=list)

    def append(self, op: Op) -> None:
        self.ops.append(op)

    def __len__(self) -> int:
        return len(self.ops)

    def __iter__(self):
        return iter(self.ops)

    def to_json(self) -> str:
        return json.dumps([op_to_dict(op) for op in self.ops])


def op_to_dict(op: Op) -> dict:
    # Field by field rather than asdict(op): that would deep-copy the site, stack and all.
    d = {}
    for f in fields(op):
        value = getattr(op, f.name)
        if f.name == "site":
            value = str(value)
        elif isinstance(value, Range):
            value = asdict(value)
        elif isinstance(value, tuple):
            value = tuple(asdict(v) if isinstance(v, Range) else v for v in value)
        elif isinstance(value, enum.Enum):
            value = value.value
        d[f.name] = value
    d["op"] = type(op).__name__
    return d
