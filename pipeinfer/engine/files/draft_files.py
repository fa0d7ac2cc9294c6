"""The draft model files of a job, settled on rank 0 before anything loads (job/roles.py):
each -md used resolved (fetched if a registry name), checked and compacted (--compact-draft),
and --draft-vocab settled to the K the head will draft over (`auto` decided from the draft's
vocabulary, config.JobConfig.settled_draft_vocab), so that every rank's config holds that
number and `--layer-split auto` times the draft as the head will run it. Each file's header
is parsed once here and kept for the loading (the reduced copy's checks, its embeddings):
for Qwen2.5's 151,936-token vocabulary a parse takes ~0.04 s."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from gguf import MODEL_TENSOR, TENSOR_NAMES

from ...model.draft_cache import compact_draft
from ...model.draft_vocab import reduced_draft
from ...model.gguf_header import Header, HeaderError, read_header
from ...model.models import ModelError, checked_header, resolve_model
from ...config.job import JobConfig

_TOKEN_EMBD = TENSOR_NAMES[MODEL_TENSOR.TOKEN_EMBD] + ".weight"


@dataclass(frozen=True)
class DraftFile:
    """A draft model as the job loads it."""
    name: str        # as given (-md)
    path: Path       # the file loaded: its compact copy unless --no-compact-draft
    header: Header   # path's header

    @property
    def n_vocab(self) -> int:
        """Rows of its token embeddings (0 if it has none: not a whole model)."""
        embd = self.header.tensors.get(_TOKEN_EMBD)
        return int(embd.shape[1]) if embd is not None else 0

    def head_file(self, draft_vocab: int) -> Path:
        """The file the head runs: the reduced copy (made now if new) for a K, else path."""
        if not draft_vocab:
            return self.path
        try:
            return reduced_draft(self.path, draft_vocab, header=self.header)
        except ModelError as err:
            raise ModelError(f"draft model (-md {Path(self.name).name}): {err}") from None


def draft_file(name: str, compact: bool) -> DraftFile:
    """The draft model `name` as a job loads it (`compact`: --compact-draft). ModelError if
    it cannot be used."""
    try:
        path = resolve_model(name)
        header = checked_header(path)
        if compact:
            loaded = compact_draft(path, header=header)
            header = header if loaded == path else read_header(loaded)
            path = loaded
    except (ModelError, HeaderError) as err:   # (HeaderError: a compact copy unreadable)
        raise ModelError(f"draft model (-md): {err}") from None
    return DraftFile(name, path, header)


def settle_drafts(cfg: JobConfig, n_ranks: int) -> tuple[JobConfig, tuple[DraftFile, ...]]:
    """Rank 0, before anything loads, for a job of `n_ranks` ranks: `cfg` with --draft-vocab
    as the K the head drafts over (0: the full vocabulary, or no draft model), and the draft
    files the job uses (every -md for pipespec, else the first; none for n-gram drafts
    alone). ValueError or ModelError if they cannot work."""
    cfg.check_drafts()
    if not cfg.uses_draft_model:
        return dataclasses.replace(cfg, draft_vocab=0), ()
    names = cfg.drafts if cfg.plan.several_drafts else cfg.drafts[:1]
    drafts = tuple(draft_file(name, cfg.compact_draft) for name in names)
    k = cfg.settled_draft_vocab(drafts[0].n_vocab, n_ranks)
    return dataclasses.replace(cfg, draft_vocab=k), drafts
