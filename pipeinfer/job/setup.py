"""Loading one rank's part of a job: the layer split, the rank's stage (a slice of the
target, or a draft model of its own), and on the head the tokenizer, prompt, pipeline,
draft model(s) and KV partitions. Fetching and slicing log their progress themselves."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from ..engine.drafting.drafter import Drafter
from ..engine.files.draft_files import DraftFile
from ..model.draft_vocab_stage import DraftVocab, ReducedStage
from ..model.embedding import Embedder
from ..engine.head.pipeline import Pipeline
from ..engine.drafting.hierarchy_remote import RemoteHierarchy
from ..model.llama_lib import LlamaError
from ..model.models import ModelError, resolve_model
from ..engine.transport.draft_link import DraftLink
from ..engine.transport.head_transport import HeadTransport
from ..model.balance import balanced_split
from ..model.partition import PartitionError, StageRange, partition
from ..schedule.partition_pool import PartitionPool
from ..model.slicing import model_info, read_model
from ..model.stage import MAX_OUTPUTS, Stage, StageConfig
from ..model.stage_cache import stage_file
from ..model.stage_loading import LoadingStage
from ..model.tokenizer import Tokenizer
from ..model.vocab_check import check_same_vocabulary
from .. import strategies
from .takeover import takeover_fractions
from ..config.job import JobConfig

SETUP_ERRORS = (ModelError, PartitionError, LlamaError, ValueError, OSError)


@dataclass
class HeadSetup:
    tokenizer: Tokenizer
    prompt: list[int]
    pipeline: Pipeline
    drafter: Drafter | None
    pool: PartitionPool | None


def plan(cfg: JobConfig, size: int) -> tuple[list[StageRange], Path]:
    strategies.get(cfg.strategy)   # (ValueError naming the known ones)
    if cfg.plan.drafts == strategies.TREE and cfg.spec.tree_width > cfg.max_run:
        raise ValueError(f"specpipe: --tree-width {cfg.spec.tree_width} cannot be exact (a tree "
                         f"level is verified as one batch, and llama.cpp rounds batches of more "
                         f"than {cfg.max_run} tokens differently with this weight layout): give "
                         f"at most {cfg.max_run}, or --no-exact")
    cfg.check_drafts()  # a draft model where the draft source needs one, n-gram sizes
    if len(cfg.threads) not in (1, size):
        raise ValueError(f"-t has {len(cfg.threads)} values for {size} ranks")
    if cfg.split == "auto":
        raise ValueError("--layer-split auto is resolved by the job's ranks together "
                         "(Job.start), not by plan()")
    model = resolve_model(cfg.model)
    header = read_model(model)
    info = model_info(header, model)
    if cfg.split:
        fractions = list(cfg.split)
    else:
        fractions = default_split(cfg, header, info.n_layer, size)
        fractions = takeover_fractions(header, info.n_layer, fractions) or fractions
    if cfg.draft_ranks:
        _check_draft_ranks(cfg, size, len(fractions))
    elif len(fractions) != size:
        raise PartitionError(f"--layer-split has {len(fractions)} fractions but the job has "
                             f"{size} ranks; give one fraction per rank")
    return partition(info.n_layer, fractions, allow_empty=cfg.leave_empty), model


def default_split(cfg: JobConfig, header, n_layer: int, size: int) -> list[float]:
    """Without --layer-split: stages of equal weight, the output head counted (model/balance.py);
    rank 0 holds no target layers when it runs a draft model (drafting is its work)."""
    head_layers = size == 1 or not cfg.uses_draft_model
    stages = size if head_layers else size - 1
    if stages > n_layer:
        raise PartitionError(f"{size} ranks but the model has only {n_layer} layers: every "
                             "rank after the head needs at least one layer")
    return balanced_split(header, n_layer, size, head_layers)


def _check_draft_ranks(cfg: JobConfig, size: int, n_target: int) -> None:
    if cfg.plan.drafts != strategies.HIERARCHY:
        raise PartitionError("draft models on ranks of their own ('/' in --layer-split) are "
                             f"for --strategy {strategies.PIPESPEC.name} only")
    if cfg.draft_ranks != len(cfg.drafts):
        raise PartitionError(f"--layer-split gives {cfg.draft_ranks} draft rank(s) but "
                             f"{len(cfg.drafts)} draft model(s) are given (-md); give /1 "
                             "for each, or none to run them in the head process")
    if n_target + cfg.draft_ranks != size:
        raise PartitionError(f"--layer-split asks for {n_target} target rank(s) and "
                             f"{cfg.draft_ranks} draft rank(s), {n_target + cfg.draft_ranks} "
                             f"in all, but the job has {size} ranks")


def draft_rank_file(draft: DraftFile, tokenizer: Tokenizer) -> Path:
    """Rank 0: the file a draft rank loads (draft_files.py), checked against the target's
    vocabulary here, where both are."""
    check_same_vocabulary(Path(draft.name).name, draft.path, tokenizer)
    return draft.path


def load_draft_rank_stage(cfg: JobConfig, path: Path, rank: int) -> Stage:
    """The draft model of a draft rank from its file (checked by rank 0, which sent it)."""
    return Stage(path, _draft_config(cfg, cfg.threads_for(rank)), final=True,
                 label=f"rank {rank} draft model")


def load_stage(cfg: JobConfig, path: Path, rng: StageRange, size: int) -> Stage | None:
    """The target's layers `rng` from `path` (the whole model for a job of one rank, else
    the rank's stage file)."""
    if rng.n_layer == 0:
        return None
    label = f"rank {rng.rank} layers [{rng.first},{rng.last})"
    return Stage(path, stage_config(cfg, rng), final=True if size == 1 else rng.final,
                 label=label)


def stage_config(cfg: JobConfig, rng: StageRange) -> StageConfig:
    pool = cfg.pool()
    return StageConfig(n_ctx=cfg.kv_size, n_batch=cfg.n_batch,
                       n_seq_max=pool.n_seq if pool else 1, n_threads=cfg.threads_for(rng.rank),
                       repack=cfg.repack_target, n_slots=cfg.slots, max_outputs=MAX_OUTPUTS,
                       refill_ctx=cfg.n_ctx if cfg.refill_along else 0, refill_batch=cfg.chunk)


def own_stage_file(model: Path, rng: StageRange, size: int) -> Path | None:
    """Rank 0's file for its own layers: the model itself when it is the only rank."""
    if rng.n_layer == 0:
        return None
    return model if size == 1 else stage_file(model, rng)


def head_setup(cfg: JobConfig, model: Path, stage: Stage | None, size: int,
               drafts: Sequence[DraftFile] = (), chain: list[int] | None = None,
               tokenizer: Tokenizer | None = None) -> HeadSetup:
    """The head's part; `drafts`, the job's draft files (draft_files.settle_drafts, which
    settled `cfg`); `tokenizer`, the target's if already open (it is the head's now)."""
    tokenizer = tokenizer or Tokenizer(model)
    prompt = [] if cfg.request.prompt is None else prompt_tokens(cfg, tokenizer)
    n_pipeline = cfg.n_pipeline(size)
    if cfg.draft_ranks:
        drafter = RemoteHierarchy(DraftLink(), range(n_pipeline, size),
                                  ahead=cfg.spec.draft * cfg.spec.max_runs,
                                  limit=min(cfg.n_ctx, len(prompt) + cfg.request.n_predict))
    else:
        drafter = _load_drafters(cfg, tokenizer, drafts) if cfg.uses_draft_model else None
    chain = chain or list(range(n_pipeline))
    transport = HeadTransport(tokenizer.n_vocab, n_ranks=n_pipeline, chain=chain) \
        if len(chain) > 1 else None
    whole = n_pipeline == 1
    embed = None if whole else Embedder(model)
    return HeadSetup(tokenizer, prompt, Pipeline(embed, stage, transport, whole_model=whole),
                     drafter, cfg.pool())


def prompt_tokens(cfg: JobConfig, tokenizer: Tokenizer) -> list[int]:
    """The job's own prompt as tokens (through the chat template with --chat), checked
    against -n and the context."""
    request = cfg.request
    text = tokenizer.apply_chat_template(request.prompt) if request.chat else request.prompt
    prompt = tokenizer.tokenize(text)
    if not prompt or not request.prompt:
        raise ValueError("the prompt is empty")
    if request.n_predict <= 0:
        raise ValueError(f"-n must be positive (got {request.n_predict})")
    if len(prompt) >= cfg.n_ctx:
        raise ValueError(f"the prompt has {len(prompt)} tokens but the context (-c) holds "
                         f"{cfg.n_ctx}; raise -c or shorten the prompt")
    if len(prompt) + request.n_predict > cfg.n_ctx:
        raise ValueError(f"the context (-c {cfg.n_ctx}) cannot hold the {len(prompt)} prompt "
                         f"tokens plus {request.n_predict} to generate (-n); raise -c or lower "
                         "-n")
    return prompt


def _load_drafters(cfg: JobConfig, tokenizer: Tokenizer,
                   drafts: Sequence[DraftFile]) -> Drafter | list[Drafter]:
    """The draft model; for strategies taking several (pipespec), the list of them, smallest
    first. Other strategies use the first -md."""
    if cfg.plan.several_drafts:
        return [_load_drafter(cfg, tokenizer, d) for d in drafts]
    return _load_drafter(cfg, tokenizer, drafts[0])


def _load_drafter(cfg: JobConfig, tokenizer: Tokenizer, draft: DraftFile) -> Drafter:
    check_same_vocabulary(Path(draft.name).name, draft.path, tokenizer)
    config = _draft_config(cfg, cfg.threads_for(0))
    if not cfg.draft_vocab:
        stage = LoadingStage(lambda: Stage(draft.path, config, final=True, label="draft model"))
        return Drafter(stage, cfg.n_batch)
    reduced = draft.head_file(cfg.draft_vocab)   # (made now if new: a bad K fails the start)
    vocab = DraftVocab.of(reduced, tokenizer.n_vocab)
    label = f"draft model ({vocab.size}-token vocabulary)"
    stage = LoadingStage(lambda: Stage(reduced, config, final=True, label=label))
    embed = Embedder(draft.path, draft.header)
    return Drafter(ReducedStage(stage, embed, vocab), cfg.n_batch, vocab)


def _draft_config(cfg: JobConfig, threads: int) -> StageConfig:
    return StageConfig(n_ctx=cfg.kv_size, n_batch=cfg.n_batch,
                       n_seq_max=(cfg.spec.tree_width + 1 if cfg.plan.drafts == strategies.TREE
                                  else cfg.spec.n_parallel),
                       n_threads=threads, n_slots=cfg.slots, max_outputs=MAX_OUTPUTS)

