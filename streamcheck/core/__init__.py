"""The analysis core: pure Python (the standard library and numpy), no CUDA, no framework.

- trace: what a stream program asked of the device, in host issue order; call sites.
- capture: what a CUDA graph capture holds, and what CUDA refuses during one.
- hb: the happens-before checker and its race reports (text, JSON).
- schedule: the sim's scheduling policies and the one delay-choice rule.
- compare: token sequences of long generations against a sequential reference.

tests/streamcheck/test_layering.py fails if anything here imports from outside it.
"""
