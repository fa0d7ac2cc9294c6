#!/bin/bash
# Follow-up of head_cpu.sh: with 3x the draft supply (the head at 0.75 core, 5 workers at 0.25)
# pipeinfer gained only 1.11x and its acceptance fell from 0.64 to 0.35, ~207 drafted tokens
# never verified. Does the cutoff let a fast head flood the pipeline? Its decay (-pd, the
# cutoff falls per draft attempt that finds nothing while no result waits) against no decay
# (-pd 0) and a higher floor (--p-floor 0.5), interleaved K=3, -n 128, under the CPU lock.
cd "$(dirname "$0")/../../.."
NODES=6; source experiments/reference/hop-2026-11-26e/arms.sh
CPUS=0.75,0.25,0.25,0.25,0.25,0.25
for rep in 1 2 3; do run ""; run "-pd 0"; run "--p-floor 0.5"; done
