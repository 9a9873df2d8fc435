"""A real signal at a chosen point of a process, for the fault tests (tests/*/test_*faults*.py).

A test puts this folder on PYTHONPATH, so Python imports this module at start-up, and names
the point in STREAMCHECK_TEST_FAULT as "SIGNAL WHEN [WHAT [N]]":

    INT import numpy                      SIGINT as `numpy` is first imported (before it runs)
    INT import-converted transformers.x   the same, and the KeyboardInterrupt turned into the
                                          ModuleNotFoundError a lazy importer makes of it
    INT after os.rename 1                 SIGINT just after the first os.rename returns
    KILL before os.replace 2              SIGKILL just before the second os.replace
    INT atexit                            SIGINT at interpreter exit, after every other atexit callback

The signal is sent to the process itself with os.kill, so it arrives exactly there.
"""
import atexit
import importlib
import os
import signal
import sys
import time

_FAULT = os.environ.get("STREAMCHECK_TEST_FAULT", "").split()


def _strike(signum: int) -> None:
    os.kill(os.getpid(), signum)
    time.sleep(5)  # the handler runs here (SIGINT raises KeyboardInterrupt out of the sleep)


class _OnImport:
    def __init__(self, signum: int, name: str, converted: bool):
        self.signum, self.name, self.converted = signum, name, converted

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        if not self.converted:
            _strike(self.signum)
            return None
        try:
            _strike(self.signum)
        except KeyboardInterrupt:
            raise ModuleNotFoundError(f"No module named {fullname!r}") from None
        return None


def _on_call(signum: int, when: str, dotted: str, nth: int) -> None:
    module_name, _, function_name = dotted.rpartition(".")
    module = importlib.import_module(module_name)
    original = getattr(module, function_name)
    calls = [0]

    def wrapper(*args, **kwargs):
        calls[0] += 1
        if calls[0] == nth and when == "before":
            _strike(signum)
        result = original(*args, **kwargs)
        if calls[0] == nth and when == "after":
            _strike(signum)
        return result

    setattr(module, function_name, wrapper)


if _FAULT:
    _signum = getattr(signal, "SIG" + _FAULT[0])
    _when = _FAULT[1]
    if _when in ("import", "import-converted"):
        sys.meta_path.insert(0, _OnImport(_signum, _FAULT[2], _when == "import-converted"))
    elif _when in ("before", "after"):
        _on_call(_signum, _when, _FAULT[2], int(_FAULT[3]) if len(_FAULT) > 3 else 1)
    elif _when == "atexit":
        atexit.register(_strike, _signum)  # registered first: runs last
    else:
        raise SystemExit(f"STREAMCHECK_TEST_FAULT={' '.join(_FAULT)!r}: unknown point {_when!r}")
