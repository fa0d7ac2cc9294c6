"""The serving slots' kept conversations (engine/head/prompt_cache.py): which slot a request
takes, how much of its prompt it reuses under each mode (exact: only whole chunks an earlier
prompt computed; llama-server: the whole common prefix; off: nothing), and the KV operations
that keep only the cells of the accepted tokens (prompt and answer), compacted."""

from __future__ import annotations

from pipeinfer.config.serving import EXACT, LLAMA_SERVER, OFF
from pipeinfer.engine.head.prompt_cache import PromptCache, common_prefix
from pipeinfer.schedule.transaction import seq_clear, seq_compact, seq_keep, seq_rm

C = 4   # the chunk size of these tests: prompts go in as chunks of 4 tokens


def served(cache: PromptCache, slot: int, kept, n_prompt: int, cached: int = 0) -> list:
    """A request in `slot` that reused `cached` tokens, had a prompt of `n_prompt` tokens
    and leaves `kept` (prompt and answer) behind."""
    cache.take(slot, cached)
    return cache.release(slot, kept, n_prompt, cached)


def test_longest_prefix_wins_ties_go_to_the_least_recently_used():
    cache = PromptCache(3, C)
    mode = LLAMA_SERVER
    assert cache.pick([0, 1, 2], [1, 2, 3], mode) == (0, 0)      # all empty: slot 0
    assert cache.take(0, 0) == []                                # nothing kept to drop
    assert cache.release(0, [1, 2, 3], 3, 0) == [seq_keep(0), seq_rm(0, 3, -1),
                                                 seq_compact(0)]
    served(cache, 1, [1, 2, 9, 9], 4)
    assert cache.pick([0, 1, 2], [1, 2, 3, 4, 5], mode) == (0, 3)
    assert cache.pick([0, 1, 2], [1, 2, 9, 9, 7], mode) == (1, 4)
    assert cache.pick([0, 1, 2], [7, 7], mode) == (2, 0)         # least recently used
    assert cache.pick([1, 2], [1, 2, 3], mode) == (1, 2)         # slot 0 is busy
    assert cache.pick([0, 1, 2], [1, 2, 3, 4], OFF) == (2, 0)
    # the same prompt again: its last token is evaluated again (its row gives a token)
    assert cache.pick([0, 1, 2], [1, 2, 3], mode) == (0, 2)


def test_exact_reuse_stops_at_the_last_whole_chunk_of_the_kept_prompt():
    """A kept prompt of 10 tokens computed chunks [0,4) [4,8) [8,10): the cells of the first
    two are the bits any fresh evaluation gives, those of the partial [8,10) and of the
    answer are not."""
    cache = PromptCache(1, C)
    prompt = list(range(10))
    served(cache, 0, prompt + [50, 51], len(prompt))          # answer 50 51 (52)
    again = prompt + [50, 51, 52, 7]
    assert cache.pick([0], again, EXACT) == (0, 8)
    assert cache.pick([0], again, LLAMA_SERVER) == (0, 12)
    assert cache.pick([0], prompt[:7] + [99], EXACT) == (0, 4)   # shared 7: one chunk
    assert cache.pick([0], prompt[:3] + [99], EXACT) == (0, 0)
    assert cache.pick([0], prompt[:9], EXACT) == (0, 8)          # (never its last token)
    assert cache.pick([0], prompt[:8], EXACT) == (0, 4)


def test_exactness_passes_on_only_through_exact_reuse():
    """A request that reused an exact prefix computes its own chunks where a fresh
    evaluation does; one that reused llama-server's way (not on a chunk's bound) leaves
    exact only what its reused prefix had."""
    cache = PromptCache(1, C)
    first = list(range(10))
    served(cache, 0, first, 10)                                # exact: [0, 8)
    second = first[:9] + list(range(100, 110))                 # 19 tokens
    slot, cached = cache.pick([0], second, EXACT)
    assert cached == 8
    served(cache, 0, second, len(second), cached)
    assert cache.slots[0].exact == 16                          # its own whole chunks
    third = second + [7]
    slot, cached = cache.pick([0], third, LLAMA_SERVER)
    assert cached == 19
    served(cache, 0, third, len(third), cached)                 # chunks from 19: not bounds
    assert cache.slots[0].exact == 16                          # what was exact stays so
    assert cache.pick([0], third + [8], EXACT) == (0, 16)


def test_taking_drops_the_cells_beyond_the_reused_prefix():
    cache = PromptCache(1, C)
    cache.release(0, [5, 6, 7, 8], 4, 0)
    assert cache.take(0, 2) == [seq_rm(0, 2, -1)]
    cache.release(0, [5, 6, 7, 8], 4, 2)
    assert cache.take(0, 4) == []
    cache.release(0, [5, 6, 7, 8], 4, 4)
    assert cache.take(0, 0) == [seq_clear()]
    assert cache.slots[0].tokens == ()        # (the slot's cells are the request's now)


def test_nothing_kept_clears_the_slot():
    cache = PromptCache(1, C)
    assert cache.release(0, [], 0, 0) == [seq_clear()]
    assert cache.pick([0], [1, 2, 3], EXACT) == (0, 0)
    assert common_prefix([1, 2, 3], [1, 2]) == 2 and common_prefix([], [1]) == 0
