"""Stands in for an environment without CuPy (issue 22, item 6): put this folder first on
PYTHONPATH and `import cupy` fails as it does where CuPy is not installed, so streamcheck's
delays fall back to torch's own bounded sleep kernel (`torch.cuda._sleep`)."""
raise ImportError("CuPy is hidden for this run (tests/gpu_programs/without_cupy): a torch-only environment")
