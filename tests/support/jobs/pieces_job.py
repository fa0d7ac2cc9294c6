"""Under mpiexec, each rank with a stage cache of its own (PIPEINFER_CACHE): rank 1 obtains the
slice [FIRST, LAST) of MODEL through weights.obtain, as a worker without the model file does
(it has no copy of its own, whatever its disk holds); rank 0 then cuts the same slice itself
and prints one JSON line: rank 1's file and bytes received, and rank 0's cut of the slice.

    mpiexec -n 1 env PIPEINFER_CACHE=A python pieces_job.py MODEL FIRST LAST FINAL : \\
            -n 1 env PIPEINFER_CACHE=B python pieces_job.py MODEL FIRST LAST FINAL
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

from pipeinfer.engine.files import weights
from pipeinfer.engine.transport.mpi import Link
from pipeinfer.model.partition import StageRange
from pipeinfer.model.stage_cache import content_digest, stage_file


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="rank %(process)d %(name)s: %(message)s")
    model = Path(sys.argv[1])
    stage = StageRange(1, int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "final")
    link = Link()
    manifest = None
    if link.rank == 0:
        digest = content_digest(model)
        manifest = weights.Manifest(str(model), str(model), digest,
                                    {1: weights.slice_need(digest, stage, "the slice")})
    manifest = link.bcast(manifest)
    weights._own_copy = lambda manifest, given: None  # rank 1 has no copy of the model
    path, received = weights.obtain(link, manifest)
    got = link.gather((str(path), received))
    if link.rank == 0:
        print(json.dumps({"path": got[1][0], "received": got[1][1],
                          "cut": str(stage_file(model, stage))}), flush=True)


if __name__ == "__main__":
    main()
