"""The scheduler core: `step(event) -> list[action]` over one generation.

A strategy is a subclass that fills in the hooks: what to do at the start, when the prefill
is done, when a run's result was absorbed, when a draft job came back, and when the driver
found nothing new (a tick). Everything shared (the run table, verification, KV
multibuffering, cancellation, finishing and draining) is here and in speculation.py.
"""

from __future__ import annotations

from .partition_pool import PartitionPool
from .actions import Finish, PolicyChanged, StartDraft, WarmDraft
from .events import (Cancel, DraftInterrupted, DraftReady, DraftsStepped, ResultArrived, Start,
                     Tick)
from .generation import Generation
from .guard import Guard
from .sources import SourceChoice
from .options import Limits, SpecOptions
from .speculation import Absorbed, Speculation


class Scheduler:
    """Base of every strategy: dispatches events to the hooks and collects the actions."""

    def __init__(self, gen: Generation, sampler, limits: Limits, opts: SpecOptions,
                 pool: PartitionPool | None):
        self.gen, self.limits, self.opts, self.pool = gen, limits, opts, pool
        self.spec = Speculation(gen, sampler, pool, limits.kv_size, cancel=opts.cancel,
                                max_run=limits.max_run)
        self.guard = Guard(opts.guard)
        self._timed = 0      # tokens generated when the guard last saw any
        self.sources = SourceChoice()
        self.finished = False
        self.prefilled = False  # no draft job goes out before the prompt is in (they wait)
        self.share = None  # serve --parallel: the pipeline as other generations share it

    @property
    def in_flight(self) -> int:
        """This generation's runs in flight."""
        return len(self.spec.fifo)

    @property
    def pipeline_load(self) -> int:
        """Runs in flight in the pipeline: this generation's, and (serve --parallel) those of
        the generations sharing it, which keep its stages busy just the same."""
        return self.share.load() if self.share is not None else self.in_flight

    @property
    def run_limit(self) -> int:
        """Most runs in flight in the pipeline before no speculative run may start: --max-runs,
        or what the generations sharing the pipeline leave (engine/head/lanes.py)."""
        limit = self.opts.max_runs
        return self.share.limit(limit) if self.share is not None else limit

    def step(self, event) -> list:
        self.guard.guessed = self.gen.counters.n_drafted
        if isinstance(event, ResultArrived):
            self._result(event.result)
        elif isinstance(event, (DraftReady, DraftInterrupted, DraftsStepped)):
            started = self.gen.counters.runs_speculative
            why = self.guard.scored(getattr(event, "agreement", None), len(self.gen.tokens),
                                    isinstance(event, DraftReady))
            if why:   # (before on_draft: the job's guesses are not sent)
                self.record("guard", self.guard.paused_for, why)
            if not self.finished:
                self.on_draft(event)
            if (isinstance(event, DraftReady) and event.origin == "model"
                    and self.gen.counters.runs_speculative == started):
                # The draft model's work that nothing came of (its first guess under the
                # cutoff, or guesses the target had made meanwhile): head CPU spent, a
                # token's worth per token it evaluated.
                self.guard.drafted(max(1, event.evaluated))
            elif isinstance(event, DraftInterrupted) and event.evaluated:
                self.guard.drafted(event.evaluated)   # (catching up, then stopped)
        elif isinstance(event, Tick):
            if self.prefilled and not self.finished:
                self.on_tick()
        elif isinstance(event, Start):
            self.on_start()
        elif isinstance(event, Cancel):
            self.stop("cancelled")
        else:
            raise TypeError(f"unknown event {event!r}")
        if self.gen.done and not self.finished:
            self.finished = True
            self.on_finish()
            self.spec.emit(Finish(self.gen.stop_reason))
        actions = self.spec.take()
        if any(isinstance(a, (StartDraft, WarmDraft)) for a in actions):
            self.guard.draft_began()
        return actions

    def _result(self, result) -> None:
        if self.finished:
            self.spec.discard(result)
            return
        absorbed = self.spec.absorb(result)
        self._observe(absorbed.run, absorbed.verified)
        self.guard.returned(absorbed.run.run_id)
        if absorbed.prefill_done:
            self.prefilled = True
            if not self.gen.done:
                self.after_prefill()
        elif not absorbed.run.prefill:
            if len(self.gen.tokens) > self._timed:   # a result that brought tokens
                self._timed = len(self.gen.tokens)
                why = self.guard.generated(self._timed, absorbed.run.speculative)
                if why:
                    self.record("guard", self.guard.paused_for, why)
            self.on_result(absorbed)

    def _observe(self, run, verified: bool) -> None:
        if run.speculative and run.guesses > 0:
            self.guard.drafted(run.guesses, run.n_accepted if verified else None)
            before = self.sources.prefers_ngram
            self.sources.observe(run.origin, run.guesses, run.n_accepted)
            if self.sources.prefers_ngram != before:
                self.record("ngram", float(self.sources.prefers_ngram),
                            f"acceptance ngram {self.sources.rate['ngram']:.2f}, "
                            f"model {self.sources.rate['model']:.2f}")

    def speculation_pays(self) -> bool:
        """The guard's word (guard.py): whether to speculate now (it times the tokens
        generated with and without speculation as results come in)."""
        ok, why = self.guard.allows(len(self.gen.tokens))
        if why:
            self.record("guard", 0, why)
        return ok

    def stop(self, reason: str) -> None:
        """End the generation (runs in flight are drained, their results discarded)."""
        if not self.gen.stop_reason:
            self.gen.stop_reason = reason

    def record(self, name: str, value: float, why: str) -> None:
        self.spec.emit(PolicyChanged(name, value, why))

    def start_cover(self) -> None:
        """After a result: if no run evaluates the pending token, start one in sequence 0."""
        if self.gen.done or self.spec.cover() is not None:
            return
        if not self.spec.fits(1):
            self.stop("kv-cache")
        else:
            self.start_main()

    def start_main(self) -> None:
        """A non-speculative run of the pending token; timed by the guard when the pipeline
        is empty and no draft job is out (its round trip is what plain decoding costs per
        token)."""
        alone = self.pipeline_load == 0 and not self.drafting()
        run = self.spec.start_main()
        if alone:
            self.guard.sent_alone(run.run_id)

    def drafting(self) -> bool:
        """Whether a draft job of this generation is out (the strategies that draft say)."""
        return False

    # --- hooks ---------------------------------------------------------------------------------
    def on_start(self) -> None:
        self.spec.prefill(self.limits.chunk, self.limits.tail)

    def after_prefill(self) -> None:
        self.start_cover()

    def on_result(self, absorbed: Absorbed) -> None:
        self.start_cover()

    def on_draft(self, event) -> None:
        raise RuntimeError(f"{type(self).__name__} drafts nothing, got {event!r}")

    def on_tick(self) -> None:
        pass

    def on_finish(self) -> None:
        pass
