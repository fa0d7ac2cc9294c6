"""Planning: how to split a model over a cluster, and what speed to expect.

inputs.py (what `plan` and `simulate` work from) <- profile.py (a cluster's measured figures,
as JSON; calibrate.py measures them under MPI, measure.py times llama.cpp on a rank,
cgroups.py reads its limits), modelled.py (nodes scaled from this machine's figures),
hosts.py (a hostfile's nodes), shape.py and header_only.py (a model's shape from its header,
or a header made up), acceptance.py (the draft's agreement, probed) -> cost.py (what a stage
costs, what bounds a strategy) -> solver.py (the split that minimises that bound within
memory) -> simulate.py (the scheduler core on a modelled clock) -> advice.py (`plan`'s
answer); auto.py (`--layer-split auto`, at a job's start)."""
