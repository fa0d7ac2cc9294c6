"""The head's schedule as a pure state machine: `Scheduler.step(event) -> list[action]`.

Nothing here imports mpi4py or llama_cpp, reads a clock or sleeps: the driver
(pipeinfer/engine/head/driver.py) polls the transport and the draft model, turns what happened
into events, and carries out the actions. A test replays scripted events; a simulator drives
the same core with a modelled clock.

events.py (what the driver reports) -> core.py (the scheduler core of every strategy) ->
actions.py (what it asks for), over generation.py (a generation's accepted tokens and stop
conditions, with counters.py) and transaction.py (runs and KV operations as issued). Shared
by the speculative strategies: runs.py (the run table's runs and token trees),
speculation.py (KV multibuffering, verification, early cancellation; partition_pool.py,
cancellation.py), cutoff.py, microbatch.py and ramp.py (when and how much to draft), guard.py
(pause speculation that does not pay), ngram.py and sources.py (drafts from the text
itself). One module per strategy with its whole schedule: iterative.py, speculative.py,
pipeinfer.py (and adaptive.py, its serving variant), pipespec.py (with buffers.py),
specpipe.py (with specpipe_tree.py, specpipe_levels.py, specpipe_kv.py, tree_draft.py);
options.py holds their knobs."""
