"""llama.cpp's grammar sampler on the head (model/grammar.py): the mask it puts on a row of
logits, its state advancing with each token, and the Sampler keeping to it."""

from __future__ import annotations

import numpy as np
import pytest

from pipeinfer.model.grammar import GrammarError, json_grammar
from pipeinfer.model.sampling import Sampler, SamplingParams

pytestmark = pytest.mark.smollm2


def test_the_mask_allows_what_the_grammar_allows(tokenizer):
    grammar = tokenizer.grammar('root ::= ("yes" | "no") "."')
    rng = np.random.default_rng(0)
    text = b""
    sampler = Sampler(SamplingParams(temp=0.0), constraint=grammar)
    for _ in range(6):
        logits = rng.standard_normal(tokenizer.n_vocab).astype(np.float32)
        masked = grammar.mask(logits)
        allowed = np.flatnonzero(np.isfinite(masked))
        pieces = {tokenizer.piece(int(t)) for t in allowed}
        assert all((text + p).startswith(b"yes.") or b"yes.".startswith(text + p)
                   or (text + p).startswith(b"no.") or b"no.".startswith(text + p)
                   or p == b"" for p in pieces)
        token = sampler.sample(logits)       # (the sampler advances the grammar)
        if tokenizer.is_eog(token):
            break
        text += tokenizer.piece(token)
    assert text in (b"yes.", b"no.") and tokenizer.is_eog(token)
    grammar.close()
    grammar.close()   # (twice is fine)


def test_bad_grammars_and_schemas_are_errors(tokenizer):
    with pytest.raises(GrammarError):
        tokenizer.grammar("root ::= (")
    assert "root" in json_grammar() and "root" in json_grammar({"type": "integer"})
    with pytest.raises(GrammarError):
        json_grammar({"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}})


def test_greedy_checks_the_likeliest_token_before_masking(tokenizer):
    """Greedy under a grammar: where the grammar allows the likeliest token the sampler takes
    it without masking the vocabulary, and every token equals the masked argmax's."""
    gbnf = json_grammar({"type": "object", "properties": {"n": {"type": "integer"}}})
    fast, slow = tokenizer.grammar(gbnf), tokenizer.grammar(gbnf)
    masks = []
    mask = fast.mask
    fast.mask = lambda logits: masks.append(1) or mask(logits)
    sampler = Sampler(SamplingParams(temp=0.0), constraint=fast)
    rng = np.random.default_rng(1)
    for step in range(8):
        logits = rng.standard_normal(tokenizer.n_vocab).astype(np.float32)
        if step % 2:    # the likeliest token made one the grammar allows
            logits[int(np.argmax(slow.mask(logits)))] += 50.0
        token = sampler.sample(logits)
        want = int(np.argmax(slow.mask(logits)))
        slow.accept(want)
        assert token == want
    assert len(masks) == 4
