"""Several generations at once through one pipeline (`pipeinfer serve --parallel N`).

A *lane* is one request's generation in a slot of its own: every stage keeps one llama.cpp
context per slot (model/stage.py), so a lane's KV cells (its canonical sequence, partitions
and graveyard) live apart from the other lanes' and it computes exactly as it would alone.
Its scheduler is the strategy's, unchanged; its actions go through a SlotPipeline, which tags
decodes and KV operations with the slot. Run ids come from the head's one counter (they grow
in issue order across lanes, as the ranks' cancellation rules need), and results, which come
back in issue order (but for the refill contexts' runs, which the ranks compute behind the
others: refill.py), go to the lane that started the run.

Scheduling order per turn: a waiting result first (its lane starts the run of its new
pending token at once, so every active request keeps its non-speculative run in flight: with
N stages and N requests every stage is busy without speculation); else each lane's draft
events and ticks in turn. Speculative runs fill the stages the requests leave idle
(PipelineShare): alone, a generation speculates up to --max-runs runs in flight, as in `run`;
with others under way, only while fewer runs than stages are in flight, since then the
requests' own runs keep the stages busy and a speculative run only delays them (and the
head's one draft model is shared by every lane). Under --busy-strategy auto a pipeinfer lane
goes further while others are under way: its drafts ride behind its pending token in that
token's own run (schedule/adaptive.py). A lane whose generation ended is drained (its runs
in flight come back and are discarded), then its slot's KV cells but those of its accepted
tokens are cleared on every rank (those stay for a later request sharing a prefix, the
conversation's next turn: prompt_cache.py; the draft model's context stays too, for the same
reason) before the slot takes another request. Under the exact cache, the whole chunks of
its prompt and answer past the slot's exact cells are evaluated again as prompt (refill.py):
with refill contexts, along the generation, each chunk once accepted, and the slot takes
their cells back when it ends; else while the pipeline is idle, until a request comes: the
next turn of that conversation takes the slot behind the refill's runs, any other request
cancels it.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any, Callable

from ..drafting.drafter import Drafter
from .embedding_job import EMBEDDING, EmbeddingJob
from .generate import Drafting, driver_for
from ..drafting.grammar_drafts import GrammarDrafter, GrammarTrack, Probe, free_drafts_on
from ...config.serving import EXACT, OFF
from .kept import Keeper
from .prompt_cache import PromptCache
from .lane import Lane, PipelineShare, SlotPipeline
from .refill import ALONG, REFILL, AlongRefill, RefillJob
from ...model.grammar import Grammar
from ...model.stage import MAX_OUTPUTS, refill_context
from ...model.sampling import Constraint, LogitObserver, Sampler, SamplingParams
from ...schedule.events import Cancel, ResultArrived
from ...schedule.generation import CANONICAL_SEQ, Generation, Request
from ...schedule.transaction import ctx_seed
from ... import strategies


log = logging.getLogger(__name__)


class Lanes:
    """The generations under way on the head (at most `cfg.slots`), through one pipeline."""

    def __init__(self, head):
        cfg, setup = head.cfg, head.setup
        for strategy in filter(None, (cfg.strategy, cfg.busy_strategy)):
            if not strategies.get(strategy).lanes and cfg.slots > 1:
                raise ValueError(f"strategy {strategy} generates one request at a time")
        self.head, self.cfg, self.pipe = head, cfg, setup.pipeline
        drafter = setup.drafter
        self._drafters = ([Drafter(drafter.stage.slot(k), drafter.n_batch, drafter.vocab)
                           for k in range(cfg.slots)] if isinstance(drafter, Drafter)
                          else [drafter] * cfg.slots)
        self._free = list(range(cfg.slots))
        self._to_refill: set[int] = set()   # free slots a refill may add exact cells to
        self.cache = PromptCache(cfg.slots, cfg.chunk)
        self.keeper = Keeper(getattr(head, "tokens_kept", None),
                             getattr(head, "restored", {}), cfg.chunk,
                             drafts=getattr(head, "drafts_kept", None))
        for restored in self.keeper.restored.values():
            self.cache.reserve(restored.slot, restored.tokens)
        self.keeper.take_back_drafts(self.drafter_of)
        self._probe: Probe | None = None     # the vocabulary's one-character tokens (grammars)
        self._owners: dict[int, Lane] = {}   # run id in flight -> its lane
        self._share = PipelineShare(self)
        self.active: list[Lane] = []

    @property
    def n_free(self) -> int:
        return len(self._free)

    def drafter_of(self, slot: int):
        """Slot `slot`'s draft model (a Drafter), or None."""
        drafter = self._drafters[slot]
        return drafter if isinstance(drafter, Drafter) else None

    def start(self, request: Request, sampling: SamplingParams, owner: Any,
              on_token: Callable[[int], None], observe: LogitObserver | None = None,
              cache: str = OFF, constraint: Constraint | None = None, keep: int = 0) -> Lane:
        """A generation of `request` in a free slot (its prefill goes out now); `observe`
        sees each generated position's logits and the token chosen (model/sampling.py);
        `cache`: what of the prefix a slot keeps may spare evaluating it again
        (prompt_cache.py: EXACT, LLAMA_SERVER or OFF); `constraint`: a grammar its tokens
        keep to; `keep`: the request's key, under which the ranks keep copies of its cells
        (kept.py), and its cells taken back after a failure, if they were."""
        claimed = self.keeper.claim(keep, self._free, request) if keep else None
        if claimed is not None:
            slot, cached = claimed
            ops = self.cache.resume(slot, cached, len(request.prompt))
        else:
            slot, cached = self._pick(request, cache)
            ops = self.cache.take(slot, cached)
        self._take(slot)
        self.keeper.started(slot, keep, cached)
        self.keeper.keep_drafts(slot, self.drafter_of(slot))
        head = self.head
        pipe = SlotPipeline(self.pipe, slot, self._owners)
        pipe.kv(ops)
        request = replace(request, cached=cached)
        gen = Generation(request, head.tokenizer.is_eog, on_token, run_ids=head.run_ids)
        strategy = self.strategy_now()
        sampler = Sampler(sampling, history=gen.last, observe=observe, constraint=constraint,
                          position=len(gen.request.resumed))
        drafting = Drafting(self._drafter_for(slot, gen, constraint),
                            self._track(gen, constraint), threaded=True)
        driver = driver_for(strategy, pipe, gen, sampler, self.cfg, drafting, self.cfg.pool(),
                            head.trace)
        driver.sched.share = self._share
        lane = pipe.lane = Lane(slot, driver, owner, strategy, cache)
        if claimed is None:
            lane.along = self._along(slot, request, cache)
        self.active.append(lane)
        driver.begin()
        return lane

    def _along(self, slot: int, request: Request, cache: str) -> AlongRefill | None:
        """The refill along a generation in `slot` (refill.py): under the exact cache, where
        the stages have refill contexts (`serve --refill-along`), not for a resumed request."""
        if cache != EXACT or not self.cfg.refill_along or request.resumed:
            return None
        start = self.cache.exact_start(slot, request.cached, len(request.prompt))
        pipe = SlotPipeline(self.pipe, refill_context(slot, self.cfg.slots), self._owners)
        job = AlongRefill(pipe, slot, start, self.cfg.n_ctx, self.cfg.chunk, self.head.run_ids)
        pipe.lane = Lane(slot, job, None, ALONG)
        return job

    def start_embedding(self, inputs: list[list[int]], owner: Any, pooling: str) -> Lane:
        """An embedding request in a free slot (the least recently used: its kept cells are
        dropped), its runs out now (embedding_job.py)."""
        slot, _ = self.cache.pick(self._free, (), OFF)
        self._take(slot)
        pipe = SlotPipeline(self.pipe, slot, self._owners)
        pipe.kv(self.cache.take(slot, 0))
        job = EmbeddingJob(pipe, inputs, self.head.run_ids,
                           min(self.cfg.n_batch, MAX_OUTPUTS), pooling)
        lane = pipe.lane = Lane(slot, job, owner, EMBEDDING)
        self.active.append(lane)
        job.begin()
        return lane

    def _pick(self, request: Request, cache: str) -> tuple[int, int]:
        """(slot, prompt tokens whose cells it keeps) for a request: the slot refilling the
        conversation it continues, its refill's cells counted as kept (their runs are on
        their way, ahead of the request's own), else the best free one."""
        refill = self._refill_continued(request.prompt, cache, bool(request.resumed))
        if refill is None:
            return self.cache.pick(self._free, request.prompt, cache)
        job: RefillJob = refill.driver
        job.continued = True
        self.cache.refilled(refill.slot, job.stop)
        log.info("slot %d: the request continues its refill", refill.slot)
        return refill.slot, self.cache.usable(refill.slot, request.prompt, cache)

    def _refill_continued(self, prompt, cache: str, resumed: bool) -> Lane | None:
        """The refill lane whose tokens `prompt` starts with and goes beyond: a fresh
        evaluation of `prompt` computes that refill's chunks first, as it does. (Only under
        the exact cache, and not for a resumed request: it reuses what its ranks kept.)"""
        if cache != EXACT or resumed:
            return None
        for lane in self.active:
            job = lane.driver
            if (lane.strategy == REFILL and not job.cancelled and not job.continued
                    and len(prompt) > job.stop
                    and tuple(prompt[:job.stop]) == job.tokens[:job.stop]):
                return lane
        return None

    def continues(self, prompt, cache: str, resumed: bool) -> bool:
        """Whether a request with `prompt` would take a refilling slot (Lanes.start)."""
        return self._refill_continued(prompt, cache, resumed) is not None

    def _take(self, slot: int) -> None:
        if slot in self._free:   # (a slot whose refill the request continues is not free)
            self._free.remove(slot)
        self._to_refill.discard(slot)
        self.keeper.forfeit(slot)

    def _drafter_for(self, slot: int, gen: Generation, constraint: Constraint | None):
        """The slot's draft model, under the request's grammar if it has one: its drafts
        cut to the grammar, the text the grammar forces drafted for free
        (grammar_drafts.py; PIPEINFER_FREE_DRAFTS=0: not, to measure what they bring)."""
        drafter = self._drafters[slot]
        if not isinstance(constraint, Grammar) or not isinstance(drafter, Drafter):
            return drafter
        return GrammarDrafter(drafter, constraint.fresh(), len(gen.request.prompt),
                              self._probe_for(constraint), self._tokenize, gen.counters,
                              free_drafts_on())

    def _track(self, gen: Generation, constraint: Constraint | None) -> GrammarTrack | None:
        """The request's grammar for its n-gram lookups (on the head's thread: a state of
        its own), as _drafter_for's for the draft model; None without a grammar."""
        if not isinstance(constraint, Grammar):
            return None
        return GrammarTrack(constraint.fresh(), len(gen.request.prompt),
                            self._probe_for(constraint), self._tokenize, gen.counters,
                            free_drafts_on())

    def _tokenize(self, text: str) -> list[int]:
        return self.head.tokenizer.tokenize(text, add_special=False, parse_special=False)

    def _probe_for(self, constraint: Grammar) -> Probe:
        if self._probe is None:
            self._probe = Probe(self._tokenize, self.head.tokenizer.piece, constraint.eos)
        return self._probe

    def strategy_now(self) -> str:
        """The strategy of a generation starting now: --busy-strategy while another is under
        way (the pipeline is then full of the requests' own runs, so drafts ride in the
        request's runs instead of runs of their own), else --strategy. The adaptive
        pipeinfer (schedule/adaptive.py) switches by itself: every generation gets it."""
        if self.cfg.busy_strategy == strategies.ADAPTIVE.name:
            return strategies.ADAPTIVE.name
        busy = any(not lane.finished and lane.strategy != REFILL for lane in self.active)
        return self.cfg.busy_strategy if busy and self.cfg.busy_strategy else self.cfg.strategy

    def _release(self, lane: Lane) -> list:
        """The KV operations leaving `lane`'s slot with only the cells worth keeping."""
        if lane.strategy == EMBEDDING:
            return self.cache.release(lane.slot, [], 0, 0)
        if lane.strategy == REFILL:
            job: RefillJob = lane.driver
            self.cache.refilled(lane.slot, job.exact)
            return job.kv_after()
        request = lane.gen.request
        ops = self.cache.release(lane.slot, kept_tokens(lane), len(request.prompt),
                                 request.cached)
        along = lane.along
        if along is None or along.stop <= self.cache.slots[lane.slot].exact:
            return ops
        # The refill context's cells, those of runs still on their way too: the ranks apply
        # this after them, and nothing cancels a refill along (refill.py).
        self.cache.took_back(lane.slot, along.tokens[:along.stop])
        log.info("slot %d: takes back %d tokens refilled along its generation", lane.slot,
                 along.stop - along.start)
        return [ctx_seed(CANONICAL_SEQ, refill_context(lane.slot, self.cfg.slots))]

    def cancel(self, lane: Lane) -> None:
        """End `lane`'s generation now (its runs in flight are drained all the same)."""
        if not lane.finished:
            lane.driver.feed(Cancel())

    def turn(self) -> bool:
        """A waiting result to its lane, else every lane's draft work and tick; False when
        nothing happened."""
        result = self.pipe.poll()
        if result is not None:
            lane = self._owners.pop(result.run_id)
            lane.driver.feed(ResultArrived(result.run_id, result))
            if lane.strategy not in (REFILL, ALONG):   # (their slots may be another's now)
                lane.driver.pipe.kv(self.keeper.progressed(lane))
                if lane.along is not None:
                    lane.along.offer(lane.gen)
            return True
        busy = False
        for lane in self.active:
            if not lane.finished:
                busy = lane.driver.turn_drafts() or busy
        return busy

    @property
    def refilling(self) -> bool:
        """Whether a refill no request continues is under way (or being cancelled)."""
        return any(lane.strategy == REFILL and not lane.driver.continued
                   for lane in self.active)

    def stop_refills(self) -> None:
        """Cancel every refill no request continues (a request waits): their slots keep
        what came back."""
        for lane in self.active:
            if lane.strategy == REFILL and not lane.driver.continued:
                lane.driver.feed(Cancel())

    def refill_idle(self) -> None:
        """With no generation under way, refill the slots whose last request kept an exact
        prefix and left whole chunks after it (refill.py). The serve loop calls it when no
        request waits."""
        if not self._to_refill or any(lane.strategy != REFILL for lane in self.active):
            return   # (nothing to refill, or a refill would delay their runs)
        for slot in sorted(self._to_refill & set(self._free)):
            start, stop = self.cache.refill_span(slot)
            if stop <= start:
                continue
            pipe = SlotPipeline(self.pipe, slot, self._owners)
            job = RefillJob(pipe, self.cache.slots[slot].tokens, start, stop, self.cfg.chunk,
                            self.head.run_ids)
            pipe.lane = Lane(slot, job, None, REFILL)
            log.info("slot %d: refilling %d tokens", slot, stop - start)
            self._free.remove(slot)
            self.active.append(pipe.lane)
            job.begin()
        self._to_refill.clear()

    def reap(self) -> list[Lane]:
        """The requests' lanes whose generations ended and whose runs are all back: their
        slots are cleared (every rank's KV cells of the slot but those of the accepted
        tokens; the draft context only if nothing is kept) and free again, or refilled
        first (refill.py)."""
        done = [lane for lane in self.active if lane.drained]
        for lane in done:
            self.active.remove(lane)
            if lane.strategy == REFILL:
                job = lane.driver
                log.info("slot %d: %d of the %d tokens refilled%s", lane.slot,
                         job.exact - job.start, job.stop - job.start,
                         " (a request came)" if job.cancelled
                         else " (a request continued it)" if job.continued else "")
                if not job.continued:   # (else the slot is that request's already)
                    lane.driver.pipe.kv(self._release(lane))
                    self._free.append(lane.slot)
                continue
            if lane.driver.drafts is not None:
                lane.driver.drafts.close()
            # (the lane's SlotPipeline: its slot)
            lane.driver.pipe.kv(self.keeper.ended(lane.slot, self.drafter_of(lane.slot))
                                + self._release(lane))
            drafter = self._drafters[lane.slot]
            if isinstance(drafter, Drafter):
                if self.cache.slots[lane.slot].tokens and _keeps_draft_context(lane.strategy):
                    drafter.stage.seq_keep(0)   # its context stays (Drafter.sync then
                else:                           # evaluates only what the next turn adds)
                    drafter.reset()
            if lane.cache == EXACT:   # (an embedding's lane has no cache: OFF)
                self._to_refill.add(lane.slot)
            self._free.append(lane.slot)
        return [lane for lane in done if lane.strategy != REFILL]


def _keeps_draft_context(strategy: str) -> bool:
    """Whether a slot keeps its draft model's context for the next request: the strategies
    whose draft model keeps nothing else between jobs (specpipe's tree drafts hold more)."""
    plan = strategies.STRATEGIES.get(strategy)
    return plan is not None and plan.keeps_draft_context


def kept_tokens(lane: Lane) -> list[int]:
    """The tokens whose cells sequence 0 of a drained lane holds from position 0: its
    scheduler's count of them (Speculation.c0: the prompt, then the accepted tokens whose
    runs came back; only the reused prefix if its prefill was cut short)."""
    gen = lane.gen
    accepted = gen.accepted
    return accepted[:min(lane.driver.sched.spec.c0, len(accepted))]
