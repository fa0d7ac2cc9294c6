"""--draft-vocab auto, the default (engine/files/draft_files.py, JobConfig.settled_draft_vocab): real
files, real mpiexec.

auto is 32768 for pipeinfer on a pipeline of 4 ranks or more whose draft model has a vocabulary
of at least 65536 tokens (the Qwen2.5 pair, when cached), and 0 without an error elsewhere
(fewer ranks, the other strategies, the tiny models' small vocabulary, pipespec, draft ranks,
n-gram drafts alone); the run reports the K it used, and the target's answer is the same as
with --draft-vocab 0. A K given with pipespec is still refused
(test_draft_vocab.test_cli_refuses_bad_draft_vocab); --layer-split auto times the draft the
head runs, its reduced copy.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from pipeinfer.config.drafts import AUTO
from pipeinfer.config.job import JobConfig
from pipeinfer.engine.files.draft_files import settle_drafts
from pipeinfer.model.draft_vocab import DRAFT_VOCAB_VERSION
from pipeinfer.schedule.options import SpecOptions
from support import mpi_util
from support.cached_models import cached_models
from support.reduced_drafts import K_QWEN, K_TINY, QWEN_PROMPT, run_json
from support.tiny_set import PROMPT, greedy_reference

SPECULATING = ("pipeinfer", "speculative", "specpipe")


@pytest.fixture(scope="module")
def qwen():
    """(target, compact draft)."""
    return cached_models("qwen-coder-1.5b", "qwen-coder-0.5b-q4_0")


def _settled(cfg: JobConfig, n_ranks: int = 4, **changes) -> int:
    settled, _ = settle_drafts(replace(cfg, **changes), n_ranks)
    return settled.draft_vocab


def test_auto_is_the_full_vocabulary_where_a_reduced_draft_does_not_apply(tiny) -> None:
    """The tiny draft's vocabulary is below 65,536 tokens: 0 for every strategy; without a
    draft model, 0 even for a K given."""
    cfg = JobConfig(model=str(tiny.target), drafts=(str(tiny.aligned),))
    assert cfg.draft_vocab == AUTO
    for strategy in (*SPECULATING, "pipespec"):
        assert _settled(cfg, strategy=strategy) == 0, strategy
    assert _settled(cfg, strategy="pipeinfer", draft_vocab=K_TINY) == K_TINY
    ngram = SpecOptions(draft_source="ngram")
    assert _settled(cfg, strategy="pipeinfer", spec=ngram, draft_vocab=K_TINY) == 0
    assert _settled(cfg, strategy="iterative", drafts=()) == 0


def test_auto_is_32768_for_pipeinfer_on_4_ranks_with_the_qwen_pair(qwen) -> None:
    """Qwen2.5's 151,936 tokens: 32768 for pipeinfer on 4 or more ranks (where the head's
    drafting sets the pace); 0, without an error, on fewer ranks, for the other strategies,
    pipespec (in the head or on a draft rank, whose ranks do not count) and n-gram drafts
    alone; a K given is kept, 0 too; a K given with pipespec is refused."""
    target, draft = qwen
    cfg = JobConfig(model=str(target), drafts=(str(draft),))
    for n_ranks in (4, 5, 8):
        assert _settled(cfg, n_ranks, strategy="pipeinfer") == K_QWEN, n_ranks
    for n_ranks in (1, 2, 3):
        assert _settled(cfg, n_ranks, strategy="pipeinfer") == 0, n_ranks
    for strategy in ("speculative", "specpipe", "pipespec"):
        assert _settled(cfg, 8, strategy=strategy) == 0, strategy
    assert _settled(cfg, 5, strategy="pipespec", draft_ranks=1) == 0
    ngram = SpecOptions(draft_source="ngram")
    assert _settled(cfg, 8, strategy="pipeinfer", spec=ngram) == 0
    assert _settled(cfg, 8, strategy="pipeinfer", draft_vocab=0) == 0
    assert _settled(cfg, 2, strategy="pipeinfer", draft_vocab=4096) == 4096
    assert _settled(cfg, 1, strategy="speculative", draft_vocab=4096) == 4096
    with pytest.raises(ValueError, match="--draft-vocab: strategy pipespec"):
        settle_drafts(replace(cfg, strategy="pipespec", draft_vocab=64), 4)


@pytest.mark.slow
def test_qwen_default_drafts_over_32768_tokens_on_4_ranks_same_answer(qwen) -> None:
    """`pipeinfer run` without --draft-vocab on 4 ranks: the run reports K = 32768 and emits
    the tokens of --draft-vocab 0; on 2 ranks the default is the full vocabulary."""
    target, draft = qwen
    args = ("--strategy", "pipeinfer", "-md", str(draft))
    split = ("--layer-split", "0,0.3333,0.3333,0.3334")
    n = 24
    default = run_json(4, target, *args, *split, n_predict=n, timeout=600, prompt=QWEN_PROMPT)
    full = run_json(4, target, *args, *split, "--draft-vocab", "0", n_predict=n, timeout=600,
                    prompt=QWEN_PROMPT)
    assert default["draft_vocab"] == K_QWEN and full["draft_vocab"] == 0
    assert default["n_drafted"] > 0, "nothing was speculated: the test would prove nothing"
    assert default["tokens"] == full["tokens"] and len(default["tokens"]) == n
    two = run_json(2, target, *args, "--layer-split", "0,1", n_predict=4, timeout=400,
                   prompt=QWEN_PROMPT)
    assert two["draft_vocab"] == 0 and two["tokens"] == full["tokens"][:4]


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["pipeinfer", "pipespec"])
def test_tiny_default_runs_as_before(tiny, strategy: str) -> None:
    """The default with the tiny pair (a small vocabulary), pipespec too: no error, the full
    vocabulary reported, the greedy tokens."""
    n = 24
    result = run_json(2, tiny.target, "--strategy", strategy, "-md", str(tiny.aligned),
                      "--layer-split", "0,1", n_predict=n)
    assert result["draft_vocab"] == 0
    assert result["tokens"] == greedy_reference(tiny.target, tiny.prompt, n)


@pytest.mark.parametrize("value", ["-1", "some"])
def test_cli_refuses_a_draft_vocab_that_is_no_number(tiny, value: str) -> None:
    launch = mpi_util.run_pipeinfer(None, tiny.target, PROMPT, "-md", str(tiny.aligned),
                                    "--draft-vocab", value, n_predict=4, timeout=60)
    assert launch.rc == 2 and not launch.timed_out, launch.describe()
    assert "give auto, 0 (the full vocabulary) or a number of tokens" in launch.stderr, \
        launch.describe()


@pytest.mark.slow
def test_auto_split_times_the_reduced_draft(tiny, tmp_path) -> None:
    """--layer-split auto with --draft-vocab K: the profile's draft is the reduced copy the
    head runs (its file name ends with -k<K>-v<N>.gguf), timed; the tokens are the greedy
    ones."""
    profile = tmp_path / "profile.json"
    n = 8
    result = run_json(2, tiny.target, "--strategy", "pipeinfer", "-md", str(tiny.aligned),
                      "--draft-vocab", str(K_TINY), "--layer-split", "auto", "--profile",
                      str(profile), n_predict=n, timeout=180)
    data = json.loads(profile.read_text())
    assert data["draft"]["name"].endswith(f"-k{K_TINY}-v{DRAFT_VOCAB_VERSION}.gguf"), data
    assert data["nodes"][0]["draft_ms"] > 0
    assert result["draft_vocab"] == K_TINY
    assert result["tokens"] == greedy_reference(tiny.target, tiny.prompt, n)


def test_auto_split_with_a_missing_draft_ends_every_rank(tiny, tmp_path) -> None:
    """Rank 0 settles the draft files before the ranks calibrate together: a draft it cannot
    find ends the job on every rank with one message (no rank left waiting)."""
    launch = mpi_util.run_pipeinfer(2, tiny.target, PROMPT, "--strategy", "pipeinfer", "-md",
                                    str(tmp_path / "missing.gguf"), "--layer-split", "auto",
                                    "--profile", str(tmp_path / "p.json"), n_predict=4,
                                    timeout=120)
    assert launch.rc != 0 and not launch.timed_out, launch.describe()
    errors = mpi_util.error_lines(launch.stderr)
    assert errors and "model file not found" in errors[0], launch.describe()
    assert "Traceback" not in launch.stderr, launch.describe()
