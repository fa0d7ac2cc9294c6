"""The machinery of a running job around the pure scheduler core (pipeinfer/schedule/), by
concern; a job (pipeinfer/job/) puts it together on each rank:

files/ (each rank's weights and the draft models, before anything loads) ; head/ (rank 0:
the pipeline as the scheduler sees it, the driver loop, lanes of several generations) <->
drafting/ (where draft jobs run: the draft model, n-grams, grammars, model hierarchies) ;
transport/ (MPI messages and their wire format, wake-ups, file transfer) carries the head's
runs to worker/ (ranks 1..N-1: apply each transaction to their slice of layers)."""
