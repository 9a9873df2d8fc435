"""Paths the tests compute once, wherever their module lies under tests/."""
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent  # the repository
GPU_PROGRAMS = ROOT / "tests" / "gpu_programs"  # the scripts the GPU tests run under `streamcheck run`
FAULT_INJECTION = ROOT / "tests" / "fault_injection"  # on PYTHONPATH: a real signal at a chosen point (its sitecustomize)
