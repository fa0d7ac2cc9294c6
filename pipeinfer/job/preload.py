"""A relaunched job's ranks load the stage they held in the last job of the same front
while the head plans the split (which they would otherwise wait for, idle): each rank notes
its stage file and layers once loaded; the next job's rank of the same number, in a job of
as many ranks, starts loading that file on a thread at once, and takes the stage if the plan
gives it the same file, layers and settings (else it waits for the load, closes the stage
and loads its own). A job of another size (a host was lost) loads nothing early."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from ..model.kept_cells import front_dir
from ..model.partition import StageRange
from ..model.stage_loading import LoadingStage

log = logging.getLogger(__name__)


def _record(rank: int, size: int) -> Path | None:
    directory = front_dir()
    return None if directory is None else directory / f"rank{rank}-of-{size}.stage.json"


class Preload:
    def __init__(self, rank: int, size: int, load):
        """`load(path, rng)`: the stage of file `path` holding `rng` (setup.load_stage)."""
        self.rank, self.size = rank, size
        self.noted: tuple[str, StageRange] | None = None
        self.loading: LoadingStage | None = None
        self.used = False   # the stage loaded early was the one
        record = _record(rank, size)
        try:
            noted = json.loads(record.read_text()) if record is not None else None
            path, rng = noted["path"], StageRange(**noted["range"])
        except (OSError, ValueError, KeyError, TypeError):
            return
        if Path(path).is_file():
            self.noted = path, rng
            self.loading = LoadingStage(lambda: load(Path(path), rng), "stage preload")

    def take(self, path: Path | None, rng: StageRange, config):
        """The stage loaded early if it is the one the plan gives this rank (file `path`,
        layers `rng`, stage settings `config`), else None (the early one closed)."""
        if self.loading is None:
            return None
        loading, self.loading = self.loading, None
        try:
            stage = loading.result()
        except Exception as err:  # noqa: BLE001 (the rank loads its stage as usual)
            log.info("rank %d: the stage loaded early failed (%s)", self.rank, err)
            return None
        if stage is not None and (str(path), rng) == self.noted and stage.config == config:
            self.used = True
            return stage
        if stage is not None:
            stage.close()
        return None

    def note(self, path: Path | None, rng: StageRange) -> None:
        """What this rank loaded, for the next job's."""
        record = _record(self.rank, self.size)
        if record is None or path is None:
            return
        try:
            record.parent.mkdir(parents=True, exist_ok=True)
            record.write_text(json.dumps({"path": str(path), "range": vars(rng)}))
        except OSError:
            pass
