"""Call sites (core/trace.py: CallSite, SiteResolver, SiteSettings): the user's frame, the innermost
frame, the stack, paths relative to the root, and what counts as a library. Driven through the
device API's resolver (device_objects.caller_site), as programs reach it; every test runs with the
walk in Python and, where it is built, in C (native/sites.cpp), which must give the same sites."""
from __future__ import annotations

import gc
import importlib.util
import pickle
import sys
import threading

import pytest

from streamcheck.core import trace as T
from streamcheck.core.hb import format_report
from streamcheck.core.trace import (LIBRARY, MACHINERY, USER, CallSite, SiteResolver, SiteSettings, set_site_settings,
                                    site_path)
from streamcheck.device import Device
from streamcheck.device.objects import caller_site

# A wrapper module by one file name in two packages (pkg1/ops.py, pkg2/ops.py), and the user's
# program that calls them: the situation where a base name alone points nowhere.
WRAPPER = '''
def write(dev, stream, x):
    dev.launch(lambda v: None, (x,), stream=stream, writes=[x], name="write")
'''
PROGRAM = '''
def program(dev, ops1, ops2):
    a, b = dev.stream("A"), dev.stream("B")
    x = dev.alloc(4, fill=0.0, name="x")
    ops2.write(dev, b, x)
    ops1.write(dev, a, x)
    ops1.write(dev, a, x)
'''
WRAPPER_LINE = 3
# PROGRAM's lines: ops2's call, then ops1's two calls (two call paths to one wrapper line).
CALL_OPS2, CALL_OPS1_FIRST, CALL_OPS1_SECOND = 5, 6, 7


def _load(path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(autouse=True, params=["python-walk", "native-walk"])
def walk(request, monkeypatch):
    """Each test with the resolvers' walk in Python, then in C (skipped where it is not built)."""
    if request.param == "python-walk":
        monkeypatch.setattr(T, "_Walker", None)  # resolvers made in the test
        monkeypatch.setattr(caller_site, "walker", None)
    elif T._Walker is None:  # (the resolvers were made with the walker wherever it is built)
        pytest.skip("the native call-site walk is not built here (pip install -e . builds it)")
    return request.param


@pytest.fixture
def wrapped(tmp_path):
    """(run, tmp_path): run() runs PROGRAM through the two wrappers on the sim; its races."""
    for pkg in ("pkg1", "pkg2"):
        (tmp_path / pkg).mkdir()
        (tmp_path / pkg / "ops.py").write_text(WRAPPER)
    (tmp_path / "main.py").write_text(PROGRAM)
    ops1 = _load(tmp_path / "pkg1" / "ops.py", "sites_pkg1_ops")
    ops2 = _load(tmp_path / "pkg2" / "ops.py", "sites_pkg2_ops")
    main = _load(tmp_path / "main.py", "sites_main")

    def run():
        dev = Device("sim")
        main.program(dev, ops1, ops2)
        return dev.races

    return run, tmp_path


def test_two_wrappers_of_one_file_name_are_told_apart_and_the_callers_line_is_in_the_stack(wrapped, settings):
    run, root = wrapped
    settings(root=str(root))
    [race] = run()  # the user frames are the wrappers' lines: both calls of ops1 fold into one report
    assert (site_path(race.first.site), site_path(race.second.site)) == (
        f"pkg2/ops.py:{WRAPPER_LINE}", f"pkg1/ops.py:{WRAPPER_LINE}")
    assert race.first.site.innermost is None and race.count == 2
    text = race.format()
    assert f"stream B: `write` writes at pkg2/ops.py:{WRAPPER_LINE}\n" in text
    assert f"stream A: `write` writes at pkg1/ops.py:{WRAPPER_LINE}\n" in text
    # The stack names the user's call of the wrapper (main.py), then this fixture's call of the program.
    stack = [(site_path(f), f.function) for f in race.second.site.stack]
    assert stack[:2] == [(f"pkg1/ops.py:{WRAPPER_LINE}", "write"), (f"main.py:{CALL_OPS1_FIRST}", "program")]
    assert format_report([race], stack=True).count(f"            main.py:{CALL_OPS1_FIRST} in program\n") == 1
    assert "in program" not in format_report([race])


def test_wrappers_named_as_libraries_give_the_users_line_and_the_wrapper_as_innermost(wrapped, settings):
    run, root = wrapped
    settings(root=str(root), libraries=(str(root / "pkg1"), str(root / "pkg2")))
    races = run()
    # Two call paths to one wrapper line are two reports, each naming the user's call.
    assert [(site_path(r.first.site), site_path(r.second.site)) for r in races] == [
        (f"main.py:{CALL_OPS2}", f"main.py:{CALL_OPS1_FIRST}"), (f"main.py:{CALL_OPS2}", f"main.py:{CALL_OPS1_SECOND}")]
    first = races[0].first
    assert (first.site.function, site_path(first.site.innermost)) == ("program", f"pkg2/ops.py:{WRAPPER_LINE}")
    assert first.describe() == f"stream B: `write` writes at main.py:{CALL_OPS2} (through pkg2/ops.py:{WRAPPER_LINE})"
    data = races[1].to_dict()
    assert data["second"]["site"] == f"main.py:{CALL_OPS1_SECOND}"
    assert data["second"]["innermost"] == {"site": f"pkg1/ops.py:{WRAPPER_LINE}", "function": "write"}
    assert data["second"]["stack"][:2] == [{"site": f"pkg1/ops.py:{WRAPPER_LINE}", "function": "write"},
                                           {"site": f"main.py:{CALL_OPS1_SECOND}", "function": "program"}]


def test_a_library_directory_does_not_take_in_a_sibling_that_shares_its_prefix(tmp_path, settings):
    (tmp_path / "pkg1").mkdir()
    (tmp_path / "pkg10").mkdir()
    settings(libraries=(str(tmp_path / "pkg1"),))
    resolver = SiteResolver(())
    assert resolver.kind_of(str(tmp_path / "pkg1" / "ops.py")) == LIBRARY
    assert resolver.kind_of(str(tmp_path / "pkg10" / "ops.py")) == USER


def test_the_standard_library_installed_packages_and_the_machinery_are_not_the_users(tmp_path):
    resolver = SiteResolver((str(tmp_path / "machinery") + "/",))
    assert resolver.kind_of(threading.__file__) == LIBRARY
    assert resolver.kind_of(pytest.__file__) == LIBRARY  # installed in site-packages
    assert resolver.kind_of("<frozen importlib._bootstrap>") == LIBRARY
    assert resolver.kind_of(str(tmp_path / "machinery" / "device.py")) == MACHINERY
    assert resolver.kind_of(__file__) == USER and resolver.kind_of("<string>") == USER


def _probe():
    return caller_site(), sys._getframe(1).f_lineno


def test_a_site_names_the_lines_python_names_and_stops_at_the_test_runner():
    site, caller_line = _probe()
    assert (site.function, site.line) == ("_probe", _probe.__code__.co_firstlineno + 1)
    # The user's frames outward: _probe, then this test; pytest's frames are not the user's.
    assert [(f.function, f.line) for f in site.stack] == [
        ("_probe", site.line), ("test_a_site_names_the_lines_python_names_and_stops_at_the_test_runner", caller_line)]
    assert site.innermost is None and site.file == __file__


def _nested(levels: int):
    return _nested(levels - 1) if levels else caller_site()


def test_the_stack_is_cut_at_the_configured_depth(settings):
    settings(depth=3)
    assert [f.function for f in _nested(5).stack] == ["_nested"] * 3
    settings(depth=8)
    assert [f.function for f in _nested(5).stack] == ["_nested"] * 6 + ["test_the_stack_is_cut_at_the_configured_depth"]


def test_one_call_path_is_one_site_object_and_another_line_another_site():
    sites = [caller_site() for _ in range(3)]
    other = caller_site()
    assert sites[0] is sites[1] is sites[2]
    assert other != sites[0] and other.line == sites[0].line + 1


def test_a_site_pickles_with_its_frames(wrapped, settings):
    run, root = wrapped
    settings(libraries=(str(root / "pkg1"), str(root / "pkg2")))
    site = run()[0].first.site
    copy = pickle.loads(pickle.dumps(site))
    assert copy == site and copy.place == site.place and copy.stack == site.stack
    assert (copy.function, copy.innermost.function) == ("program", "write")


def test_the_depth_must_be_a_positive_integer():
    with pytest.raises(ValueError, match="call-site depth must be an integer >= 1, got 0"):
        set_site_settings(SiteSettings(depth=0))


def test_sites_in_a_thread_end_with_the_users_thread_function():
    found = []
    thread = threading.Thread(target=lambda: found.append(caller_site()))
    thread.start()
    thread.join()
    [site] = found
    # threading's frames around the target are not the user's
    assert site.function == "<lambda>" and [f.function for f in site.stack] == ["<lambda>"]


def test_a_package_file_outside_the_root_is_named_by_its_package_path(tmp_path):
    pkg = tmp_path / "checkout" / "mypkg" / "sub"
    pkg.mkdir(parents=True)
    (pkg.parent / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "ops.py").write_text("")
    loose = tmp_path / "loose.py"
    loose.write_text("")
    root = tmp_path / "project"
    root.mkdir()
    assert site_path(CallSite(str(pkg / "ops.py"), 2), root=str(root)) == "mypkg/sub/ops.py:2"
    assert site_path(CallSite(str(loose), 3), root=str(root)) == f"{loose}:3"  # no package: the absolute path


def test_a_site_path_follows_the_working_directory_and_the_root_though_paths_are_resolved_once(tmp_path, monkeypatch):
    # site_path resolves each file once (reports name the same few files thousands of times):
    # what it kept must still be keyed by where the path is relative to.
    (tmp_path / "a" / "b").mkdir(parents=True)
    site = CallSite(str(tmp_path / "a" / "b" / "prog.py"), 7)
    previous = set_site_settings(SiteSettings(root=None))  # under pytest the plugin sets the rootdir
    try:
        monkeypatch.chdir(tmp_path)
        assert site_path(site) == "a/b/prog.py:7"
        monkeypatch.chdir(tmp_path / "a")
        assert site_path(site) == "b/prog.py:7"
        assert site_path(site, root=str(tmp_path)) == "a/b/prog.py:7"
        assert site_path(CallSite("b/prog.py", 8)) == "b/prog.py:8"  # a relative name, from the working directory
        assert site_path(CallSite("b/prog.py", 8), root=str(tmp_path / "a" / "b")) == "prog.py:8"
        monkeypatch.chdir(tmp_path)
        assert site_path(CallSite("b/prog.py", 8), root=str(tmp_path / "a" / "b")) == f"{tmp_path}/b/prog.py:8"
        set_site_settings(SiteSettings(root=str(tmp_path / "a" / "b")))
        assert site_path(site) == "prog.py:7"
    finally:
        set_site_settings(previous)


def test_a_site_keeps_its_place_once_built_and_it_names_both_frames():
    inner = CallSite("/lib/ops.py", 3, "write")
    site = CallSite("/proj/prog.py", 9, "program", innermost=inner)
    assert site.place == ("/proj/prog.py", 9, "program", "/lib/ops.py", 3, "write")
    assert site.place is site.place
    assert CallSite("/proj/prog.py", 9, "program").place == ("/proj/prog.py", 9, "program")


def test_a_site_read_in_a_report_still_names_its_own_program_after_that_program_is_gone():
    # One process runs programs one after another (a test session's emulated scripts): a program's code
    # objects die with it, and Python hands their memory to the next program's. The resolver's table is
    # keyed by code ids, so a site whose lines were read must keep its codes, or a later program's call
    # would come back as the earlier program's line.
    for run in range(40):
        program = compile("def issue():\n    return caller_site()\n", f"program{run}.py", "exec")
        scope = {"caller_site": caller_site}
        exec(program, scope)
        site = scope["issue"]()
        assert (site.file, site.line) == (f"program{run}.py", 2)
        str(site)  # a report reads its line
        del program, scope, site
        gc.collect()  # the function and its globals hold each other
