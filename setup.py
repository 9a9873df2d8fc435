"""The one thing pyproject.toml cannot say: the core's C++ extensions, built at install: the native checker
and the native call-site walk.

Both are optional: where one cannot be compiled (no C++ compiler, no Python headers, a Python whose frames the
walk cannot read) the install goes on without it and streamcheck runs the Python it replaces (the checker says
so in one line: streamcheck.core.fast.notice).
"""
import hashlib
from pathlib import Path

from setuptools import Extension, setup

HERE = Path(__file__).parent
SOURCE = "streamcheck/core/native/checker.cpp"
SITES_SOURCES = ("streamcheck/core/native/sites.cpp", "streamcheck/core/native/frames.h")


def sha256(*paths) -> str:
    """The hash a module carries of its sources: streamcheck.core refuses a build of other sources (an editable
    install not rebuilt after a pull) and runs its Python instead, saying so."""
    digest = hashlib.sha256()
    for path in paths:
        digest.update((HERE / path).read_bytes())
    return digest.hexdigest()


setup(
    ext_modules=[
        Extension(
            "streamcheck.core._checker_native",
            sources=[SOURCE],
            define_macros=[("SOURCE_SHA256", f'"{sha256(SOURCE)}"')],
            language="c++",
            extra_compile_args=["-std=c++17", "-O2"],
            optional=True,
        ),
        # The call-site walk in C: reads the interpreter's frames (Python 3.10 to 3.13; elsewhere it does not
        # compile, and the walk stays Python's).
        Extension(
            "streamcheck.core._sites_native",
            sources=[SITES_SOURCES[0]],
            depends=[SITES_SOURCES[1]],
            define_macros=[("SOURCE_SHA256", f'"{sha256(*SITES_SOURCES)}"')],
            language="c++",
            extra_compile_args=["-std=c++20", "-O2"],
            optional=True,
        ),
    ],
)
