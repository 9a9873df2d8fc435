"""The one thing pyproject.toml cannot say: the native checker, a C++ extension built at install.

It is optional: where it cannot be compiled (no C++ compiler, no Python headers) the install goes on
without it and streamcheck checks with the Python checker, saying so in one line
(streamcheck.core.fast.notice).
"""
from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "streamcheck.core._checker_native",
            sources=["streamcheck/core/native/checker.cpp"],
            language="c++",
            extra_compile_args=["-std=c++17", "-O2"],
            optional=True,
        ),
    ],
)
