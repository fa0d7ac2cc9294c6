"""The run table and what every strategy does with it: prefill, runs of the canonical
sequence, speculative runs with KV multibuffering, verification, and early cancellation
(paper IV-A, IV-C, IV-D). It emits actions instead of sending anything; `take()` hands
them to the scheduler.

The head reasons about the KV cache as a sequential program: every stage applies
transactions in the order the head issued them, so an operation issued after a run's decode
sees that run's entries on every stage. Invariants kept here:
- sequence 0 holds entries for positions [0, c0) of accepted tokens only; the newest accepted
  token (the *pending* one, at position P) is evaluated by exactly one in-flight run, its
  *cover*, and c0 == P between absorptions;
- a speculative run's partition holds a copy of its context's entries before its decode and
  is returned only after its result came back (so every stage is done with it);
- a run is cancelled only if no live run copied entries from it.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Sequence

from .partition_pool import PartitionPool
from .transaction import seq_cp, seq_rm
from .actions import CancelRuns, EmitTokens, KvOps, StartRun
from .cancellation import to_cancel, useless_runs
from .generation import CANONICAL_SEQ, Generation
from .options import EXACT_RUN_PLAIN
from .runs import Node, Run, RunState, tree_from_branches, trim_branches


def runs_of(span: range, size: int) -> list[range]:
    """`span` in consecutive runs of at most `size`."""
    return [range(a, min(a + size, span.stop)) for a in range(span.start, span.stop, size)]


def prompt_runs(span: range, chunk: int, tail: int) -> list[range]:
    """The batches a prompt's positions `span` go in as: whole chunks of `chunk` from its
    start, then what is left (less than a chunk) in runs of `tail`. A function of the span
    and the job's configuration only, so a fresh evaluation, a cached prefix's rest and a
    resumed request all compute the same batches. Whole chunks keep the cells a prompt
    cache can reuse (engine/head/prompt_cache.py); the short runs at the end go through the
    stages one behind the other instead of one batch passing them in turn, which is most of
    a short prompt's (a conversation's next turn's) time to its first token."""
    whole = span.start + len(span) // chunk * chunk
    return runs_of(range(span.start, whole), chunk) + runs_of(range(whole, span.stop),
                                                             min(tail, chunk) or chunk)


@dataclass(frozen=True)
class Absorbed:
    """What a result did: its run, whether it was verified, and whether it ended the
    prefill."""
    run: Run
    verified: bool = False
    prefill_done: bool = False


class Speculation:
    def __init__(self, gen: Generation, sampler, pool: PartitionPool | None, kv_cells: int,
                 cancel: bool = True, max_run: int = EXACT_RUN_PLAIN):
        self.gen, self.sampler, self.pool = gen, sampler, pool
        self.cancel_enabled = cancel
        self.max_run = max_run               # most tokens of a speculative run (options.py)
        # Cells are never reused within a generation (see partition_pool): count them.
        self.kv_free = kv_cells - len(gen.request.prompt) - len(gen.request.resumed)
        self.fifo: deque[Run] = deque()
        self.c0 = gen.request.cached         # sequence 0 holds positions [0, c0)
        self.sources: dict[int, int] = {}    # run id -> run id it copied its context from
        self._out: list = []

    def emit(self, action) -> None:
        self._out.append(action)

    def take(self) -> list:
        """The actions emitted since the last call."""
        out, self._out = self._out, []
        return out

    # --- views -------------------------------------------------------------------------------
    @property
    def accepted(self) -> list[int]:
        return self.gen.accepted

    @property
    def pending(self) -> int:
        return self.gen.pending

    def live(self) -> list[Run]:
        return [r for r in self.fifo if not r.cancelled]

    def cover(self) -> Run | None:
        """The in-flight run that evaluates the pending token, if any."""
        accepted = self.accepted
        for run in self.live():
            if run.base <= self.pending and run.path_to(accepted) is not None:
                return run
        return None

    def fits(self, n_tokens: int) -> bool:
        """Whether every stage's KV cache has room for n_tokens more (an upper bound)."""
        return n_tokens <= self.kv_free

    def tip(self) -> tuple[list[int], tuple[int, int] | None]:
        """The newest speculation consistent with the accepted tokens: its tokens and where a
        run continuing it copies its context from, as (run id, sequence id), or None for
        sequence 0. Needs a cover run in flight (the pending token must be evaluated)."""
        accepted = self.accepted
        for run in reversed(self.live()):
            path = _extended_path(run, accepted)
            if path:
                source_seq = run.nodes[path[-1]].seqs[0]
                context = list(run.context) + [run.nodes[i].token for i in path]
                return context, ((run.run_id, source_seq) if source_seq != CANONICAL_SEQ
                                 else None)
        raise RuntimeError("no run in flight evaluates the pending token")

    # --- starting runs -----------------------------------------------------------------------
    def prefill(self, chunk: int, tail: int) -> None:
        """The prompt in batches (`prompt_runs`: chunks of `chunk`, the rest in runs of
        `tail`), all in flight at once, into sequence 0; the last batch's last row gives the
        first token. A prefix whose cells sequence 0 keeps (request.cached) is not evaluated
        again: a multiple of `chunk` where the cache is exact (engine/head/prompt_cache.py),
        so the batches after it are the ones a fresh evaluation of the whole prompt uses, and
        their cells the same bits."""
        request = self.gen.request
        tokens, n_prompt = request.prompt + request.resumed, len(request.prompt)
        self.chain(tokens, prompt_runs(range(request.cached, n_prompt), chunk, tail),
                   (CANONICAL_SEQ,), count_cells=False, final=not request.resumed)
        # Tokens generated before a restart: in runs of at most the exact run size, which
        # compute as one-token decoding did (options.py), so every cell is as it was. (Those
        # whose cells the ranks kept, request.cached past the prompt, are not evaluated.)
        self.chain(tokens, runs_of(range(max(n_prompt, request.cached), len(tokens)),
                                   self.max_run), (CANONICAL_SEQ,), count_cells=False)

    def chain(self, tokens, chunks: list[range], seqs: tuple[int, ...], ops: list = (),
              tree_ids: tuple[int, ...] = (), count_cells: bool = True,
              final: bool = True) -> None:
        """A run for each of `chunks` (consecutive positions of `tokens`) in sequences
        `seqs` (after KV ops `ops`); only the last chunk's last row is output (its tree node:
        `tree_ids`), unless not `final` (more follow)."""
        end = chunks[-1].stop if chunks else 0
        for span in chunks:
            first, chunk = span.start, tokens[span.start:span.stop]
            last = final and span.stop == end
            run = Run(self.gen.next_run_id(), first, tuple(tokens[:first]),
                      [Node(t, i - 1, i, seqs) for i, t in enumerate(chunk)],
                      speculative=False, prefill=True, final_chunk=last,
                      tree_ids=tree_ids if last else ())
            self.launch(run, list(ops), count_cells=count_cells)
            ops = []

    def start_main(self) -> Run:
        """A non-speculative run of the pending token, in sequence 0."""
        p = self.pending
        assert self.c0 == p, (self.c0, p)
        tokens = self.accepted
        run = Run(self.gen.next_run_id(), p, tuple(tokens[:p]),
                  [Node(tokens[p], -1, 0, (CANONICAL_SEQ,))], speculative=False, main_path=[0])
        self.launch(run, [])
        return run

    def start_speculative(self, context: Sequence[int], branches: list[list[int]],
                          source: tuple[int, int] | None, origin: str = "model") -> Run:
        """A run of the draft tree `branches` continuing `context`, whose entries are copied
        from `source` = (run id, sequence id) (None: sequence 0), in a free partition; a tree
        over max_run nodes is cut (trim_branches)."""
        branches = trim_branches(branches, self.max_run)
        partition = self.pool.take()
        nodes, main = tree_from_branches(branches, partition[:len(branches)])
        run = Run(self.gen.next_run_id(), len(context), tuple(context), nodes, speculative=True,
                  partition=partition, main_path=main, origin=origin)
        src_run, src_seq = source if source is not None else (-1, CANONICAL_SEQ)
        grave = self.pool.graveyard
        ops = [op for s in partition for op in (seq_cp(s, grave), seq_rm(s))]
        ops += [seq_cp(src_seq, s, -1, run.base) for s in partition[:len(branches)]]
        if src_run >= 0:
            self.sources[run.run_id] = src_run
        self.launch(run, ops)
        c = self.gen.counters
        c.runs_speculative += 1
        c.microbatch_tokens += len(nodes)
        # A root at the pending position is the pending token itself, not a guess.
        run.guesses = len(nodes) - (0 if run.base > self.pending else 1)
        c.n_drafted += run.guesses
        if origin == "ngram":  # drafts of the text itself are counted apart too
            c.n_drafted_ngram += run.guesses
        return run

    def launch(self, run: Run, kv_ops: list, count_cells: bool = True) -> None:
        """Send `run` into the pipeline after `kv_ops` and enter it in the run table (also
        for runs a strategy builds itself: specpipe's tree levels)."""
        if count_cells:
            if not self.fits(len(run.nodes)):
                raise RuntimeError(f"KV cache full: {run.describe()} does not fit")
            self.kv_free -= len(run.nodes)
        if kv_ops:
            self.emit(KvOps(tuple(kv_ops)))
        self.emit(StartRun(run.tx(), tuple(run.tokens())))
        self.fifo.append(run)
        self.gen.counters.runs_started += 1

    # --- absorbing results -------------------------------------------------------------------
    def absorb(self, result) -> Absorbed:
        """Verify a finished run, accept tokens, fix up KV, cancel runs that became useless."""
        run = self.pop(result)
        if run.prefill:
            if run.final_chunk:
                self.accept([result.token(-1, self.sampler)], run.run_id)
                self.c0 = self.pending
            return Absorbed(run, prefill_done=run.final_chunk)
        if run.cancelled or result.cancelled or run.classify(self.accepted) != RunState.VALID:
            self._unverified(run)
            return Absorbed(run)
        self._verify(run, result)
        if not self.gen.done:
            self._cancel_useless()
        cover = self.cover()
        if cover is not None and cover.base == self.pending and cover.speculative:
            self._credit(cover, 1)  # its root was the draft's guess of this token
            cover.root_credited = True
        return Absorbed(run, verified=True)

    def discard(self, result) -> None:
        """After the generation: a run still in flight came back; nothing of it is used."""
        self._unverified(self.pop(result))

    def pop(self, result) -> Run:
        """The oldest run, leaving the table with `result` (its partition comes back); a
        strategy that verifies its runs itself (specpipe) reads the result."""
        run = self.fifo.popleft()
        if run.run_id != result.run_id:
            raise RuntimeError(f"result of run {result.run_id} arrived while {run.run_id} "
                               "was the oldest in flight")
        if run.partition is not None:
            self.pool.give_back(run.partition)
        self.sources.pop(run.run_id, None)
        return run

    def accept(self, tokens: list[int], run_id: int) -> None:
        """Accept `tokens` (decided by run `run_id`) up to a stop condition."""
        self.emit_tokens(self.gen.accept(tokens), run_id)

    def emit_tokens(self, taken: list[int], run_id: int) -> None:
        if taken:
            self.emit(EmitTokens(tuple(taken), run_id))

    def _unverified(self, run: Run) -> None:
        """`run` leaves without its result being verified: its guesses never met the target
        (except a root already counted as accepted)."""
        self.gen.counters.n_unverified += run.guesses - run.root_credited

    def _credit(self, run: Run, n: int) -> None:
        """`n` of `run`'s guesses were accepted (counted per draft origin too)."""
        c = self.gen.counters
        c.n_accepted += n
        run.n_accepted += n
        if run.origin == "ngram":
            c.n_accepted_ngram += n

    def _verify(self, run: Run, result) -> None:
        """Accept the target's tokens along `run`'s tree."""
        node = run.path_to(self.accepted)
        assert node is not None
        drafted, taken = 0, []
        while not self.gen.done:  # one sample per position, in order, none after the end
            token = result.token(node, self.sampler)
            child = next((c for c in run.children(node) if run.nodes[c].token == token), None)
            taken += self.gen.accept([token])
            if child is None:
                break
            node, drafted = child, drafted + 1
        self.emit_tokens(taken, run.run_id)
        self._credit(run, drafted)
        # Entries of the accepted path up to the new pending token move into sequence 0,
        # also when the generation just ended: a serving slot keeps them for the next turn
        # of the conversation (engine/head/prompt_cache.py).
        end, seq = self.pending, run.nodes[node].seqs[0]
        if seq != CANONICAL_SEQ and end > self.c0:
            self.emit(KvOps((seq_cp(seq, CANONICAL_SEQ, self.c0, end),)))
        self.c0 = max(self.c0, end)

    def cancel(self, runs: list[Run]) -> None:
        """Cancel `runs`, made invalid by what was accepted (for a strategy that verifies its
        runs itself: specpipe)."""
        for run in runs:
            run.cancelled = True
        self.gen.counters.runs_cancelled_invalidated += len(runs)
        if runs and self.cancel_enabled:
            self.emit(CancelRuns(tuple(r.run_id for r in runs)))

    def _cancel_useless(self) -> None:
        doomed = useless_runs(self.live(), self.accepted)
        c = self.gen.counters
        for run, state in doomed:
            run.cancelled = True
            if state == RunState.SUPERFLUOUS:
                c.runs_cancelled_superfluous += 1
            else:
                c.runs_cancelled_invalidated += 1
        ids = to_cancel([run for run, _ in doomed], self.live(), self.sources)
        if ids and self.cancel_enabled:
            self.emit(CancelRuns(tuple(ids)))


def _extended_path(run: Run, accepted: Sequence[int]) -> list[int]:
    """Node path through `run` following the accepted tokens, then its first children."""
    path, node, p = [], -1, run.base
    while True:
        children = run.children(node)
        if p < len(accepted):
            children = [c for c in children if run.nodes[c].token == accepted[p]]
        if not children:
            return path
        node = children[0]
        path.append(node)
        p += 1
