"""Testing FlashNorm's dual-stream pipeline with streamcheck: hypothesis strategies for shapes
and sync plans (`strategies`), the exhaustive oracle of which plans are safe (`oracle`) and the
tiny fixture models that recite the Zen of Python (`fixtures`).

These modules use streamcheck; streamcheck never imports them (the tool never imports its
subject). Its generic strategies (schedules, seeds, stream kinds) and hypothesis profiles
stay in `streamcheck.strategies`.
"""
