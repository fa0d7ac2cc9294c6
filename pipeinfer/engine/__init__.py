"""The MPI job around the pure scheduler core (pipeinfer/schedule/), by concern:

startup/ (every rank: plan the split, obtain and load its part, agree that all are ready) ->
head/ (rank 0: the pipeline as the scheduler sees it, the driver loop, lanes of several
generations) <-> drafting/ (where draft jobs run: the draft model, n-grams, grammars, model
hierarchies) ; transport/ (MPI messages, wake-ups, file transfer) carries the head's runs to
worker/ (ranks 1..N-1: apply each transaction to their slice of layers)."""
