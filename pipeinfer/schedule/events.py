"""What the driver tells the scheduler: frozen records with short reprs (a trace prints them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Start:
    """Begin the generation the scheduler was made for (prefill its prompt)."""

    def __repr__(self) -> str:
        return "Start()"


@dataclass(frozen=True)
class ResultArrived:
    """Run `run_id` came back from the last stage: `result` holds its output rows (logits
    or argmaxes; a RunResult), or nothing if a stage skipped or aborted it."""
    run_id: int
    result: Any

    def __repr__(self) -> str:
        return f"ResultArrived(run={self.run_id})"


@dataclass(frozen=True)
class DraftReady:
    """Draft job `job_id` finished: `branches` continue its context (branch 0 first), empty
    when the draft's first guess fell under the cutoff (or no n-gram matched). `origin`:
    where the draft came from, "model" (the draft model) or "ngram" (the text itself);
    `evaluated`: the tokens the draft model evaluated for it (catching up on the context,
    then drafting), 0 where nothing says; `agreement`: the draft's score on the tokens it
    caught up on, when the job asked for it (DraftJob.score): positions scored, confident
    (the likeliest next token at the job's cutoff or above), right (and the token that came)."""
    job_id: int
    branches: tuple[tuple[int, ...], ...]
    origin: str = "model"
    evaluated: int = 0
    agreement: tuple[int, int, int] | None = None

    def __repr__(self) -> str:
        sizes = "+".join(str(len(b)) for b in self.branches) or "0"
        source = "" if self.origin == "model" else f", {self.origin}"
        work = f", evaluated {self.evaluated}" if self.evaluated else ""
        return f"DraftReady(job={self.job_id}, tokens={sizes}{source}{work})"


@dataclass(frozen=True)
class DraftInterrupted:
    """Draft job `job_id` was stopped before it drafted anything (not a failed attempt);
    `evaluated`: the tokens the draft model evaluated meanwhile (catching up), `agreement`
    its score on them (as DraftReady's)."""
    job_id: int
    evaluated: int = 0
    agreement: tuple[int, int, int] | None = None

    def __repr__(self) -> str:
        work = f", evaluated {self.evaluated}" if self.evaluated else ""
        return f"DraftInterrupted(job={self.job_id}{work})"


@dataclass(frozen=True)
class Tick:
    """The driver polled and found nothing new."""

    def __repr__(self) -> str:
        return "Tick()"


@dataclass(frozen=True)
class Cancel:
    """The generation is cancelled (a client went away): stop as soon as possible."""

    def __repr__(self) -> str:
        return "Cancel()"


@dataclass(frozen=True)
class DraftsStepped:
    """PipeSpec: the last draft model's buffer changed (a draft or verification step)."""
    top: tuple[int, ...]

    def __repr__(self) -> str:
        return f"DraftsStepped({len(self.top)} tokens)"


Event = Start | ResultArrived | DraftReady | DraftInterrupted | Tick | Cancel | DraftsStepped
