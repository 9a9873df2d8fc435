"""The test suite: tests/streamcheck/ and tests/flashnorm_kernels/ mirror the packages they test.

Every folder of test modules is a package, tests/ itself at the top, so pytest imports each module
under its full name (tests.streamcheck.pictures.test_export), the name other test modules import it by: it
is loaded once, and two folders may hold the same basename. Without tests/__init__.py pytest would
put tests/ on sys.path, and tests/streamcheck/ would shadow the streamcheck package.
"""
