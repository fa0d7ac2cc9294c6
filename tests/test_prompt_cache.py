"""The serving slots' kept prompts (engine/prompt_cache.py): which slot a request takes, how
much of its prompt it reuses, and the KV operations that keep only the prompt's cells."""

from __future__ import annotations

from pipeinfer.engine.prompt_cache import PromptCache, common_prefix
from pipeinfer.schedule.transaction import seq_clear, seq_keep, seq_rm


def test_longest_prefix_wins_ties_go_to_the_least_recently_used():
    cache = PromptCache(3)
    assert cache.pick([0, 1, 2], [1, 2, 3], reuse=True) == (0, 0)   # all empty: slot 0
    assert cache.take(0, 0) == []                                   # nothing kept to drop
    assert cache.release(0, [1, 2, 3], prefilled=True) == [seq_keep(0), seq_rm(0, 3, -1)]
    cache.take(1, 0)
    cache.release(1, [1, 2, 9, 9], prefilled=True)
    assert cache.pick([0, 1, 2], [1, 2, 3, 4, 5], reuse=True) == (0, 3)
    assert cache.pick([0, 1, 2], [1, 2, 9, 9, 7], reuse=True) == (1, 4)
    assert cache.pick([0, 1, 2], [7, 7], reuse=True) == (2, 0)      # least recently used
    assert cache.pick([1, 2], [1, 2, 3], reuse=True) == (1, 2)      # slot 0 is busy
    assert cache.pick([0, 1, 2], [1, 2, 3, 4], reuse=False) == (2, 0)
    # the same prompt again: its last token is evaluated again (its row gives a token)
    assert cache.pick([0, 1, 2], [1, 2, 3], reuse=True) == (0, 2)


def test_taking_drops_the_cells_beyond_the_reused_prefix():
    cache = PromptCache(1)
    cache.release(0, [5, 6, 7, 8], prefilled=True)
    assert cache.take(0, 2) == [seq_rm(0, 2, -1)]
    cache.release(0, [5, 6, 7, 8], prefilled=True)
    assert cache.take(0, 4) == []
    cache.release(0, [5, 6, 7, 8], prefilled=True)
    assert cache.take(0, 0) == [seq_clear()]
    assert cache.slots[0].tokens == ()        # (the slot's cells are the request's now)


def test_a_prefill_cut_short_keeps_nothing():
    cache = PromptCache(1)
    assert cache.release(0, [1, 2, 3], prefilled=False) == [seq_clear()]
    assert cache.pick([0], [1, 2, 3], reuse=True) == (0, 0)
    assert common_prefix([1, 2, 3], [1, 2]) == 2 and common_prefix([], [1]) == 0
