"""Whether a draft model shares the target's vocabulary (speculation compares token ids), and
the memo of a check that passed: comparing Qwen2.5's 151,936 pieces one by one takes a second
or more on a small node, which every start of a job would pay again, a relaunched `serve`
job too."""

from __future__ import annotations

import hashlib
from pathlib import Path

from .stage_cache import content_digest, stages_dir
from .tokenizer import Tokenizer


def check_same_vocabulary(name: str, draft_path: Path, target: Tokenizer) -> None:
    """Raise ValueError (naming the draft `name`) unless the draft's tokens are the target's,
    id for id; a pair that passed once (by both files' content digests) is not compared
    again."""
    memo = _memo(Path(target.path), draft_path)
    if memo is not None and memo.exists():
        return
    draft = Tokenizer(draft_path)
    try:
        if draft.n_vocab != target.n_vocab:
            raise ValueError(f"the draft model {name} has {draft.n_vocab} tokens in its "
                             f"vocabulary but the target has {target.n_vocab}; they must share "
                             "one vocabulary")
        for token in range(target.n_vocab):
            if draft.piece(token) != target.piece(token):
                raise ValueError(f"the draft model {name} and the target disagree on token "
                                 f"{token} ({draft.piece(token)!r} vs {target.piece(token)!r}); "
                                 "they must share one vocabulary")
    finally:
        draft.close()
    if memo is not None:
        try:
            memo.parent.mkdir(parents=True, exist_ok=True)
            memo.touch()
        except OSError:
            pass   # (a cache that cannot be written: checked again next time)


def _memo(target: Path, draft: Path) -> Path | None:
    try:
        pair = content_digest(target) + content_digest(draft)
    except OSError:
        return None
    return stages_dir() / "vocab-checks" / hashlib.sha256(pair.encode()).hexdigest()[:32]
