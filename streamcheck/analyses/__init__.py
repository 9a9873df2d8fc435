"""Analyses over a recorded trace, built on the core's checker: pure Python, no CUDA import.

`sync_audit`: which synchronizations a run needs, which it wastes, and which host syncs could
be device-side waits (docs/sync-audit.md).
"""
