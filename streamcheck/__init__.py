"""streamcheck: find CUDA stream races by happens-before analysis and injected schedules."""
