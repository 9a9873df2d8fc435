"""Pictures of a recorded trace: the timeline model (timeline_model.py), the Perfetto export
(export.py) and the PNG (timeline.py), also importable as `streamcheck.export` and
`streamcheck.timeline`. Nothing is imported here: timeline.py imports matplotlib.
"""
