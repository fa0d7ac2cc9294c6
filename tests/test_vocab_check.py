"""The draft/target vocabulary check and its memo: a pair that passed is not compared again
(every relaunch of a served job paid 1.3 s for it), a pair with other content still is."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeinfer.model import vocab_check
from support import tinymodel
from pipeinfer.model.tokenizer import Tokenizer


class Counting(Tokenizer):
    opened: list[str] = []

    def __init__(self, path):
        Counting.opened.append(str(path))
        super().__init__(path)


@pytest.fixture
def counting(monkeypatch, tmp_path: Path):
    monkeypatch.setenv("PIPEINFER_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(vocab_check, "Tokenizer", Counting)
    Counting.opened = []
    return Counting.opened


def test_a_pair_that_passed_is_not_compared_again(tmp_path: Path, counting):
    target = tinymodel.write_tiny_llama(tmp_path / "target.gguf", n_layer=2, seed=1)
    draft = tinymodel.write_tiny_llama(tmp_path / "draft.gguf", n_layer=1, seed=2)
    tok = Tokenizer(target)
    vocab_check.check_same_vocabulary("draft.gguf", draft, tok)
    assert counting == [str(draft)]          # compared once: the draft's vocabulary opened
    vocab_check.check_same_vocabulary("draft.gguf", draft, tok)
    assert counting == [str(draft)]          # the memo: not opened again
    tok.close()


def test_a_pair_that_differs_is_refused_every_time(tmp_path: Path, counting):
    target = tinymodel.write_tiny_llama(tmp_path / "target.gguf", n_layer=2, seed=1)
    small = tinymodel.write_tiny_llama(tmp_path / "small.gguf", n_layer=1, n_merges=10)
    tok = Tokenizer(target)
    if Tokenizer(small).n_vocab == tok.n_vocab:
        pytest.skip("the tiny models' vocabularies do not differ by n_merges")
    for _ in range(2):
        with pytest.raises(ValueError, match="share one vocabulary"):
            vocab_check.check_same_vocabulary("small.gguf", small, tok)
    assert counting == [str(small)] * 2      # no memo for a failed check
    tok.close()
