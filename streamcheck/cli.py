"""`streamcheck` command line: its own subcommands, and those installed packages plug in.

A subcommand is a `register(subparsers)` function, which adds its parser and sets `func`
to a callable taking the parsed args and returning an exit status. The built-in ones are
the modules of streamcheck.commands; a package adds its own with an entry point in the
`streamcheck.commands` group, named after the command (that is how the FlashNorm package
adds `repro` and `fuzz`: the tool never imports its subject). A plugin that fails to load
leaves the other commands working and says why when its command is run.
Exit status 2 means bad usage or an environment that cannot run the command; 141 (128 + SIGPIPE,
as a shell reports for `cat`) that the reader of stdout went away (`streamcheck demo | head`); 130
that Ctrl-C stopped it, wherever it landed (one line on stderr, streamcheck/interrupts.py).
"""
from __future__ import annotations

import os
import sys

# Only what main() needs to catch a Ctrl-C: the rest is imported inside the functions.
from . import interrupts

PLUGIN_GROUP = "streamcheck.commands"
INTERRUPTED_LINE = "streamcheck: interrupted (Ctrl-C); stopped"


def version() -> str:
    from importlib import metadata

    try:
        return metadata.version("streamcheck")
    except metadata.PackageNotFoundError:  # a source tree that was never installed
        return "unknown (not installed)"


def _origin(entry_point) -> str:
    """`name = module:function`, and the distribution that declares it."""
    dist = entry_point.dist
    declared = f" (from {dist.name} {dist.version})" if dist is not None else ""
    return f"{entry_point.name} = {entry_point.value}{declared}"


def _add_unavailable(sub, entry_point, error: BaseException) -> None:
    """A stand-in for a plugin command that failed to load: listed in --help, and run it
    prints why (one line, exit 2) instead of a traceback."""
    problem = (f"streamcheck {entry_point.name}: cannot run: its plugin failed to load "
               f"(entry point {_origin(entry_point)} in group {PLUGIN_GROUP}): {type(error).__name__}: {error}; "
               "reinstall the package that provides it")

    def explain(args) -> int:
        print(problem, file=sys.stderr)
        return 2

    parser = sub.add_parser(entry_point.name, help="unavailable: its plugin failed to load (run it to see why)",
                            description=problem)
    # Whatever arguments follow are the real command's: main() lets this one take them all.
    parser.set_defaults(func=explain, takes_any_arguments=True)


def _add_plugins(sub) -> None:
    from importlib import metadata

    for entry_point in sorted(metadata.entry_points(group=PLUGIN_GROUP), key=lambda ep: ep.name):
        if entry_point.name in sub.choices:
            print(f"streamcheck: ignoring the plugin command {_origin(entry_point)}: "
                  f"`streamcheck {entry_point.name}` is already defined", file=sys.stderr)
            continue
        try:
            entry_point.load()(sub)
        except Exception as exc:  # anything a third party's import or register() raises is reported, not raised
            if entry_point.name not in sub.choices:
                _add_unavailable(sub, entry_point, exc)


def build_parser() -> argparse.ArgumentParser:
    import argparse

    parser = argparse.ArgumentParser(
        prog="streamcheck", description="Find CUDA stream synchronization bugs.",
        epilog=f"Installed packages may add commands (entry point group {PLUGIN_GROUP}).")
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    from .commands import demo, run  # numpy and more: imported once main() catches a Ctrl-C

    for module in (run, demo):
        module.register(sub)
    _add_plugins(sub)
    return parser


def _stdout_closed() -> int:
    """The reader of stdout went away (`| head`): stop quietly, as `cat` does, not with a traceback."""
    try:  # Python flushes stdout again at exit: send that flush nowhere, so it cannot fail too
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):  # stdout is not a file descriptor (replaced by a caller)
        pass
    return 141


def main(argv=None) -> int:
    """The `streamcheck` command. Ctrl-C, wherever it lands (imports, the command, shutdown):
    one line and exit status 130 (streamcheck/interrupts.py)."""
    interrupts.install()
    try:
        return _main(argv)
    except KeyboardInterrupt:
        print(INTERRUPTED_LINE, file=sys.stderr)
        return interrupts.INTERRUPTED
    finally:
        interrupts.at_exit(INTERRUPTED_LINE)  # after the heavy imports, so before their atexit clean-up


def _main(argv) -> int:
    parser = build_parser()
    # parse_args, except that an unavailable plugin command takes any arguments.
    args, unknown = parser.parse_known_args(argv)
    if unknown and not getattr(args, "takes_any_arguments", False):
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    args.owns_process = argv is None  # this process's own command line: it may re-exec itself (run --backend sim)
    try:
        status = int(args.func(args) or 0)
        sys.stdout.flush()  # here, where a closed pipe is caught, not at exit
        return status
    except BrokenPipeError:
        return _stdout_closed()


if __name__ == "__main__":
    sys.exit(main())
