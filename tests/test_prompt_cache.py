"""The serving slots' kept conversations (engine/head/prompt_cache.py): which slot a request
takes, how much of its prompt it reuses, and the KV operations that keep only the cells of
the accepted tokens (prompt and answer), compacted."""

from __future__ import annotations

from pipeinfer.engine.head.prompt_cache import PromptCache, common_prefix
from pipeinfer.schedule.transaction import seq_clear, seq_compact, seq_keep, seq_rm


def test_longest_prefix_wins_ties_go_to_the_least_recently_used():
    cache = PromptCache(3)
    assert cache.pick([0, 1, 2], [1, 2, 3], reuse=True) == (0, 0)   # all empty: slot 0
    assert cache.take(0, 0) == []                                   # nothing kept to drop
    assert cache.release(0, [1, 2, 3]) == [seq_keep(0), seq_rm(0, 3, -1),
                                           seq_compact(0)]
    cache.take(1, 0)
    cache.release(1, [1, 2, 9, 9])
    assert cache.pick([0, 1, 2], [1, 2, 3, 4, 5], reuse=True) == (0, 3)
    assert cache.pick([0, 1, 2], [1, 2, 9, 9, 7], reuse=True) == (1, 4)
    assert cache.pick([0, 1, 2], [7, 7], reuse=True) == (2, 0)      # least recently used
    assert cache.pick([1, 2], [1, 2, 3], reuse=True) == (1, 2)      # slot 0 is busy
    assert cache.pick([0, 1, 2], [1, 2, 3, 4], reuse=False) == (2, 0)
    # the same prompt again: its last token is evaluated again (its row gives a token)
    assert cache.pick([0, 1, 2], [1, 2, 3], reuse=True) == (0, 2)


def test_taking_drops_the_cells_beyond_the_reused_prefix():
    cache = PromptCache(1)
    cache.release(0, [5, 6, 7, 8])
    assert cache.take(0, 2) == [seq_rm(0, 2, -1)]
    cache.release(0, [5, 6, 7, 8])
    assert cache.take(0, 4) == []
    cache.release(0, [5, 6, 7, 8])
    assert cache.take(0, 0) == [seq_clear()]
    assert cache.slots[0].tokens == ()        # (the slot's cells are the request's now)


def test_nothing_kept_clears_the_slot():
    cache = PromptCache(1)
    assert cache.release(0, []) == [seq_clear()]
    assert cache.pick([0], [1, 2, 3], reuse=True) == (0, 0)
    assert common_prefix([1, 2, 3], [1, 2]) == 2 and common_prefix([], [1]) == 0


def test_an_answer_kept_serves_the_next_turn():
    """The kept tokens are the prompt and the answer (all but its last token, never
    evaluated): a next turn repeating them reuses both."""
    cache = PromptCache(2)
    cache.take(0, 0)
    cache.release(0, [1, 2, 3, 40, 41, 42])        # prompt 1 2 3, answer 40 41 42 (43)
    turn2 = [1, 2, 3, 40, 41, 42, 43, 7, 8]
    assert cache.pick([0, 1], turn2, reuse=True) == (0, 6)
    assert cache.take(0, 6) == []
