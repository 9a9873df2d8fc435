"""Whole-program recording: the recorder (recorder.py), one adapter per library area (adapters/),
the kernel and Triton access analysis (kernel_access.py, triton_access.py), the GPU plumbing both
GPU paths share (gpu.py), and the public API over them (instrument.py, also importable as
`streamcheck.instrument`). Nothing is imported here: the backends read gpu.py without the recorder.
"""
