"""The head's schedule as a pure state machine: `Scheduler.step(event) -> list[action]`.

Nothing here imports mpi4py or llama_cpp, reads a clock or sleeps: the driver
(pipeinfer/engine/head/driver.py) polls the transport and the draft model, turns what happened into
events, and carries out the actions. A test replays scripted events; a simulator drives the
same core with a modelled clock.

Modules: events and actions (what crosses the boundary), runs (the run table and token
trees), generation (accepted tokens and stop conditions), speculation (KV multibuffering,
verification, cancellation shared by the speculative strategies), cutoff and microbatch (the
policies of paper IV-B), and one module per strategy with its whole schedule.
"""
