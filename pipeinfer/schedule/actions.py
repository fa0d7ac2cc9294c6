"""What the scheduler asks the driver to do, in order: frozen records with short reprs."""

from __future__ import annotations

from dataclasses import dataclass

from .transaction import DecodeTx, KvOp


@dataclass(frozen=True)
class StartRun:
    """Send a run into the pipeline: its decode configuration and its tokens."""
    tx: DecodeTx
    tokens: tuple[int, ...]

    @property
    def run_id(self) -> int:
        return self.tx.run_id

    def __repr__(self) -> str:
        kind = "spec" if self.tx.speculative else "main"
        pos = self.tx.positions
        return f"StartRun(run={self.run_id} {kind} pos {min(pos)}..{max(pos)} n={len(pos)})"


@dataclass(frozen=True)
class KvOps:
    """Apply KV cache operations on every stage, after every run already started."""
    ops: tuple[KvOp, ...]

    def __repr__(self) -> str:
        return f"KvOps({', '.join(map(repr, self.ops))})"


@dataclass(frozen=True)
class CancelRuns:
    run_ids: tuple[int, ...]

    def __repr__(self) -> str:
        return f"CancelRuns({list(self.run_ids)})"


@dataclass(frozen=True)
class DraftJob:
    """One micro-batch to draft: the tree continuing `context` under `cutoff`, at most
    `budget` tokens deep. `source` is where a run continuing it copies the context's KV
    entries from ((run id, sequence id), or None for sequence 0). `room`: how long a branch
    may grow with tokens that cost no draft step (the text a grammar forces,
    engine/drafting/grammar_drafts.py): the run's own limits without --draft's (None: budget)."""
    job_id: int
    context: tuple[int, ...]
    source: tuple[int, int] | None
    cutoff: float
    budget: int
    ngram: bool = True     # --draft-source both: a lookup may answer it (sources.py)
    model: bool = True     # the draft model may answer it (not while it waits: retry.py)
    ngram_budget: int | None = None  # most tokens a lookup answers with (None: budget; ramp.py)
    room: int | None = None
    # score the draft's agreement with the tokens it catches up on (Drafter.scoring): the
    # guard asks at a probe whether speculating again could pay (guard.py). Such a job is the
    # draft model's, whatever `ngram` and `model` say
    score: bool = False

    @property
    def looks_up(self) -> bool:
        """Whether an n-gram lookup may answer it."""
        return self.ngram and not self.score

    @property
    def asks_model(self) -> bool:
        """Whether the draft model may answer it."""
        return self.model or self.score

    @property
    def free_room(self) -> int:
        """Most tokens of a branch when the ones past `budget` are free (see above)."""
        return self.budget if self.room is None else max(self.budget, self.room)

    @property
    def lookup_budget(self) -> int:
        """How many tokens a lookup may answer this job with."""
        return self.budget if self.ngram_budget is None else min(self.budget, self.ngram_budget)

    def __repr__(self) -> str:
        lookup = "" if self.lookup_budget == self.budget else f" ({self.lookup_budget} n-gram)"
        return (f"DraftJob({self.job_id} after {len(self.context)} tokens, cutoff "
                f"{self.cutoff:.3f}, budget {self.budget}{lookup}"
                f"{'' if self.looks_up else ', model'}{'' if self.asks_model else ', lookup'})")


@dataclass(frozen=True)
class StartDraft:
    job: DraftJob

    def __repr__(self) -> str:
        return f"StartDraft({self.job!r})"


@dataclass(frozen=True)
class StopDraft:
    """Ship what job `job_id` drafted so far; `stale`: drop it, its speculation is gone (its
    draft step under way may be aborted)."""
    job_id: int
    stale: bool = False

    def __repr__(self) -> str:
        return f"StopDraft(job={self.job_id}{', stale' if self.stale else ''})"


@dataclass(frozen=True)
class WarmDraft:
    """Let the draft model read `tokens` (the prompt) while the target prefills them."""
    tokens: tuple[int, ...]

    def __repr__(self) -> str:
        return f"WarmDraft({len(self.tokens)} tokens)"


@dataclass(frozen=True)
class EmitTokens:
    """Tokens accepted into the generation, in order (`run_id`: the run that decided them)."""
    tokens: tuple[int, ...]
    run_id: int

    def __repr__(self) -> str:
        return f"EmitTokens({list(self.tokens)} by run {self.run_id})"


@dataclass(frozen=True)
class Finish:
    """The generation is over (`reason`: eos, length, context, kv-cache, cancelled); runs
    still in flight are drained by the driver, whose results the scheduler discards."""
    reason: str

    def __repr__(self) -> str:
        return f"Finish({self.reason})"


@dataclass(frozen=True)
class PolicyChanged:
    """A policy's state moved (for the trace): e.g. the cutoff, with why."""
    name: str
    value: float
    why: str

    def __repr__(self) -> str:
        return f"PolicyChanged({self.name}={self.value:.4f}: {self.why})"




@dataclass(frozen=True)
class SyncDrafts:
    """PipeSpec: the draft models' buffers must extend `accepted` (`reset`: begin anew with
    it); M0 may draft up to `horizon` tokens. While the target prefills (`warm`), the draft
    models read the prompt."""
    accepted: tuple[int, ...]
    horizon: int
    reset: bool = False
    warm: bool = False

    def __repr__(self) -> str:
        kind = "reset" if self.reset else "sync"
        return f"SyncDrafts({kind} to {len(self.accepted)} tokens, horizon {self.horizon})"


@dataclass(frozen=True)
class DraftsDone:
    """PipeSpec: the generation is over; the draft models stop at `accepted` and report, with
    the target's verifications and rejections."""
    accepted: tuple[int, ...]
    verified: int
    rejections: int

    def __repr__(self) -> str:
        return f"DraftsDone({len(self.accepted)} tokens)"


Action = (StartRun | KvOps | CancelRuns | StartDraft | StopDraft | WarmDraft | EmitTokens
          | Finish | PolicyChanged | SyncDrafts | DraftsDone)
