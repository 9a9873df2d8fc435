"""The one thing pyproject.toml cannot say: the native checker, a C++ extension built at install.

It is optional: where it cannot be compiled (no C++ compiler, no Python headers) the install goes on
without it and streamcheck checks with the Python checker, saying so in one line
(streamcheck.core.fast.notice).
"""
import hashlib
from pathlib import Path

from setuptools import Extension, setup

SOURCE = "streamcheck/core/native/checker.cpp"
# The module carries its source's hash: streamcheck.core.fast refuses a build of another source (an editable
# install not rebuilt after a pull) and checks in Python, saying so.
SOURCE_SHA256 = hashlib.sha256((Path(__file__).parent / SOURCE).read_bytes()).hexdigest()

setup(
    ext_modules=[
        Extension(
            "streamcheck.core._checker_native",
            sources=[SOURCE],
            define_macros=[("SOURCE_SHA256", f'"{SOURCE_SHA256}"')],
            language="c++",
            extra_compile_args=["-std=c++17", "-O2"],
            optional=True,
        ),
    ],
)
