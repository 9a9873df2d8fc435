"""Repository-wide test settings (kept small: the plugin itself lives in streamcheck/plugin.py)."""
import os

# One BLAS/OpenMP thread per process: the suite runs under xdist on 2 cores and its
# matrices are tiny, so extra threads only spin against each other. Set before
# numpy or torch is imported.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
from streamcheck.strategies import load_profile

pytest_plugins = ["pytester"]

# Our own suite (not a user's: the plugin loads no profile) runs the bounded, derandomized
# `streamcheck-ci` profile unless one is named: STREAMCHECK_HYPOTHESIS_PROFILE=dev or
# HYPOTHESIS_PROFILE=dev (short names are ours here), or --hypothesis-profile=streamcheck-dev,
# which wins (hypothesis's plugin loads it later).
load_profile(default=os.environ.get("HYPOTHESIS_PROFILE", "").strip() or "streamcheck-ci")
