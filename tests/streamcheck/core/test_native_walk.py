"""The call-site walk in C (core/native/sites.cpp, through SiteResolver.walker) against SiteResolver's
walk in Python, its reference: the same CallSite object for every call path, the held fallback where no
user frame is on the stack, and again once the site settings or the forwarding wrappers change.
tests/streamcheck/core/test_trace_sites.py runs every site test with each walk."""
from __future__ import annotations

import concurrent.futures

import pytest

from streamcheck.core import trace as T
from streamcheck.core.trace import CallSite, SiteResolver

from .test_trace_sites import _load

pytestmark = pytest.mark.skipif(T._Walker is None, reason="the native call-site walk is not built here "
                                                           "(pip install -e . builds it)")


def _through(resolver, depth):  # `depth` frames of this file between the test and the resolver
    return resolver() if depth == 0 else _through(resolver, depth - 1)


def test_the_walk_in_c_gives_the_python_walks_site_object_for_every_call_path(tmp_path, settings):
    """The C walk against the Python walk of the same resolver, call path by call path: the user's frame
    after machinery, library and forwarding frames, the user's callers cut at the depth, a path with no user
    frame (the held fallback, else the library's frames), and again after the settings change."""
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "wrap.py").write_text(
        "def call(f, *args):\n    return f(*args)\n\n\ndef forward(f, *args):\n    return f(*args)\n")
    lib = _load(tmp_path / "lib" / "wrap.py", "sites_walk_lib")
    T.skip_wrapper_frames(lib.__file__, "forward")
    settings(libraries=(str(tmp_path / "lib"),), depth=3)
    resolver = SiteResolver((str(tmp_path / "machinery"),))
    assert resolver.walker is not None
    walker = resolver.walker

    def both(call):
        sites = []
        for each in (walker, None):
            resolver.walker = each
            sites.append(call())
        resolver.walker = walker
        return sites

    paths = {
        "direct": lambda: _through(resolver, 0),
        "deep": lambda: _through(resolver, 6),
        "through a library": lambda: lib.call(_through, resolver, 2),
        "through a forwarding wrapper": lambda: lib.forward(lib.call, _through, resolver, 1),
        "a library calling the resolver": lambda: lib.call(lib.call, resolver),
    }
    for depth in (3, 1):
        settings(libraries=(str(tmp_path / "lib"),), depth=depth)
        for name, call in paths.items():
            by_c, by_python = both(call)
            assert by_c is by_python, (name, depth)
            assert len(by_c.stack) <= depth
        library_first = both(paths["a library calling the resolver"])[0]
        assert (library_first.function, library_first.innermost.file) == ("<lambda>", lib.__file__)
    with concurrent.futures.ThreadPoolExecutor(1) as worker:  # a thread of the standard library's frames only
        by_c, by_python = both(lambda: worker.submit(resolver).result())
        assert by_c is by_python and by_c.file == concurrent.futures.thread.__file__
        fallback = CallSite("runner.py", 7, "run")
        held = resolver.fallback(fallback)
        worker.submit(held.__enter__).result()  # the worker's calls with no user frame resolve to it
        assert both(lambda: worker.submit(resolver).result()) == [fallback, fallback]
        worker.submit(held.__exit__).result()


def test_a_walk_during_which_the_walker_is_reset_walks_again_and_a_classify_error_reaches_the_caller():
    """classify runs Python, where another thread may reset the walker (other site settings): the walk
    starts again, so its stack holds only codes the walker keeps. An error of classify is the caller's."""
    resets = []

    def classify(code):
        if not resets:
            resets.append(code)
            walker.reset(8)  # as another thread would, meanwhile
        return T.USER

    walker = T._Walker(classify, 8)
    first, again = [walker.walk() for _ in range(2)]  # every frame the user's: the list's and this one's
    frames, user = walker.stack(first)
    assert len(resets) == 1 and user == 0 and len(frames) == 8
    assert again == first  # the kinds kept since the reset: the same path, the same id

    def broken(code):
        raise RuntimeError("classify failed")

    with pytest.raises(RuntimeError, match="classify failed"):
        T._Walker(broken, 8).walk()
    with pytest.raises(ValueError, match="not a frame kind"):
        T._Walker(lambda code: 7, 8).walk()


def test_a_resolver_and_its_walker_are_collected_together():
    """The walker holds the resolver's classify (a bound method) and the resolver holds the walker: a cycle,
    which the collector frees (a recorder makes a resolver per recording)."""
    import gc
    import weakref

    resolver = SiteResolver(())
    gone = weakref.ref(resolver)
    resolver()
    del resolver
    gc.collect()
    assert gone() is None


def test_the_python_walk_answers_when_asked_or_when_the_module_was_built_from_other_sources(monkeypatch):
    """STREAMCHECK_NATIVE_SITES=0 walks in Python; so does an editable install whose module was built from
    another sites.cpp or frames.h (not rebuilt after a pull), and a module that reads the frames wrongly."""
    import importlib

    module = importlib.import_module("streamcheck.core._sites_native")
    assert T._native_walker() is module.Walker
    monkeypatch.setenv("STREAMCHECK_NATIVE_SITES", "0")
    assert T._native_walker() is None
    monkeypatch.delenv("STREAMCHECK_NATIVE_SITES")
    monkeypatch.setattr(module, "SOURCE_SHA256", "0" * 64)
    assert T._native_walker() is None
    monkeypatch.undo()
    read = module.frames_here
    monkeypatch.setattr(module, "frames_here", lambda: read()[2:])  # frames missed
    assert T._native_walker() is None
