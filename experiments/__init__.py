"""Benchmarks that reproduce every published figure of pipeinfer, and the harness under them.

Each script here is an entry point with `--help` (docs/benchmarks.md gives one command per
figure); the code they share is the package `experiments.harness`. Run a script as
`python experiments/NAME.py ...` from anywhere, or import it as `experiments.NAME` with the
repository on the path (the tests do: pytest's `pythonpath`).
"""
