"""Planning: how to split a model over a cluster, and what speed to expect.

cost (the cost model: a stage's time per step, a strategy's bound), solver (the split that
minimises that bound within memory), shape (a model's layers and bytes from its GGUF header),
profile (a cluster's measured figures, as JSON), calibrate (measuring them, under MPI),
simulate (the scheduler core driven by a modelled clock), command (the CLI commands)."""
