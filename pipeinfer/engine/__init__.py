"""The head's machinery around the pure scheduler core: the driver loop, where draft jobs
run, the trace, and `generate`, which puts them together for one generation."""
