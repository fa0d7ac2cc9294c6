"""A pipeinfer MPI job, started on every rank: supervisor.py (a process per rank that names
it if a signal kills it) -> roles.py (plan the split: plan_phase.py, `--layer-split auto`
through pipeinfer/plan/, after a lost host takeover.py's split that keeps layers in place;
obtain each rank's files through engine/files/; load, or take the
stage preload.py loaded while the head planned; agree that all are ready; take back the KV
cells the last job's ranks kept: restore.py, assembling a stage's by layer where the split
changed: assemble.py; then the head's role, generating, or a
worker's) with setup.py (loading a rank's stage, and the head's tokenizer, pipeline and
draft models) and startup.py (how long each step took on each rank, logged) -> layout.py
(what each rank of the started job holds, for the front's console)."""
