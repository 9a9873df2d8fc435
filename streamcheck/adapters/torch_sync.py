"""torch.cuda.synchronize, for CuPy programs that hand tensors to torch and back: a device
synchronize. (Only when torch is already loaded: a recording never imports torch.)"""
from __future__ import annotations

import sys

from .. import recorder as R
from .patching import Patch, forwarding, quiet


def _synchronize(orig):
    def synchronize(device=None):
        if quiet():
            return orig(device)
        return R.current.device_sync(lambda: orig(device))
    return forwarding(orig, synchronize)


def patches() -> tuple:
    """The entry points this adapter intercepts (none while torch is not loaded)."""
    if "torch" not in sys.modules:
        return ()
    return (Patch("torch.cuda.synchronize", _synchronize),)
