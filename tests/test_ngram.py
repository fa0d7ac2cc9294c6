"""Drafts without a draft model (issue 22 item 1): n-gram lookup on constructed token
sequences, its draft executor, the scheduler core driven with it (no MPI, no llama.cpp),
the command line's checks, and exactness under the real mpiexec: speculative and pipeinfer
with `--draft-source ngram` (no -md) and `both` give the oracle's greedy tokens, on a prompt
whose continuation repeats it, so the n-gram drafts are really used and accepted."""

from __future__ import annotations

import csv

import pytest

from pipeinfer.config.drafts import resolve_draft_source
from pipeinfer.config.job import JobConfig
from pipeinfer.engine.drafting.ngram_drafts import NgramDrafts
from pipeinfer.schedule import actions as A
from pipeinfer.schedule.actions import DraftJob
from pipeinfer.schedule.events import DraftReady
from pipeinfer.schedule.ngram import NGRAM_LIMIT, ngram_draft
from pipeinfer.schedule.options import SpecOptions
from pipeinfer.schedule.pipeinfer import PipeInfer
from pipeinfer.schedule.speculative import Speculative
from support import mpi_util
from support.ngram_runs import CODE_PROMPT, N_CODE, SPLIT, oracle, run
from support.ngram_script import PROMPT, TARGET, drive, make
from support.scripted_executor import ScriptedModel


# --- the lookup ------------------------------------------------------------------------------

def test_suffix_found_copies_what_followed():
    assert ngram_draft([1, 2, 3, 9, 9, 1, 2], 2, 4, 3) == [3, 9, 9]


def test_longest_match_wins_over_a_shorter_later_one():
    # [1, 2, 3] occurred once (then 7); its suffix [2, 3] occurred later too (then 6)
    context = [5, 1, 2, 3, 7, 8, 2, 3, 6, 1, 2, 3]
    assert ngram_draft(context, 2, 4, 1) == [7]
    assert ngram_draft(context, 2, 2, 1) == [6]      # only pairs: the latest pair wins


def test_latest_occurrence_wins_among_equal_lengths():
    assert ngram_draft([1, 2, 7, 1, 2, 8, 1, 2], 2, 4, 2) == [8, 1]


def test_no_match_gives_nothing():
    assert ngram_draft([1, 2, 3, 4, 5], 2, 4, 4) == []
    assert ngram_draft([1, 2, 3, 1], 2, 4, 4) == []          # a single token is too short
    assert ngram_draft([1, 2, 3, 1], 1, 4, 2) == [2, 3]      # ... unless n_min is 1
    assert ngram_draft([], 1, 4, 4) == [] and ngram_draft([7], 1, 4, 4) == []


def test_budget_bounds_the_draft():
    context = [1, 2, 3, 4, 5, 6, 1, 2]
    assert ngram_draft(context, 2, 4, 0) == []
    assert ngram_draft(context, 2, 4, 2) == [3, 4]
    assert ngram_draft(context, 2, 4, 5) == [3, 4, 5, 6, 1]


def test_copy_past_the_end_repeats_the_pattern():
    """Self-overlapping copy (LZ77): what follows the match runs into the suffix itself."""
    assert ngram_draft([4, 5, 6, 4, 5], 2, 4, 7) == [6, 4, 5, 6, 4, 5, 6]
    assert ngram_draft([7, 7, 7], 2, 4, 3) == [7, 7, 7]


def test_sizes_are_checked():
    with pytest.raises(ValueError):
        ngram_draft([1, 2, 1, 2], 3, 2, 4)
    with pytest.raises(ValueError):
        ngram_draft([1, 2, 1, 2], 0, 2, 4)


# --- the executor ------------------------------------------------------------------------------

def job(job_id, context, budget=4):
    return DraftJob(job_id, tuple(context), None, 0.3, budget)


def test_executor_answers_a_hit_at_once():
    drafts = NgramDrafts(2, 4)
    drafts.submit(job(3, [1, 2, 3, 1, 2], budget=2))
    event = drafts.poll()
    assert event == DraftReady(3, ((3, 1),), origin="ngram")
    assert "ngram" in repr(event) and "ngram" not in repr(DraftReady(3, ((3,),)))
    assert drafts.poll() is None
    drafts.warm([1, 2]), drafts.stop(3), drafts.close()   # nothing to do without a model
    assert drafts.idle() is False


def test_executor_miss_without_a_model_gives_no_branches():
    drafts = NgramDrafts(2, 4)
    drafts.submit(job(0, [1, 2, 3, 4]))
    assert drafts.poll() == DraftReady(0, (), origin="ngram")


def test_executor_miss_goes_to_the_model():
    model = ScriptedModel(target=[1, 2, 3, 4, 5, 6, 7])
    drafts = NgramDrafts(2, 4, fallback=model)
    drafts.warm([1, 2, 3])
    drafts.submit(job(0, [1, 2, 3, 1, 2], budget=1))      # a hit: the model never sees it
    drafts.submit(job(1, [1, 2, 3, 4], budget=2))         # a miss: the model drafts
    assert drafts.poll() == DraftReady(0, ((3,),), origin="ngram")
    assert drafts.poll() == DraftReady(1, ((5, 6),), origin="model")
    drafts.stop(1), drafts.idle(), drafts.close()
    assert model.calls == ["warm", ("submit", 1), ("stop", 1), "idle", "close"]


def test_executor_refuses_crossed_sizes():
    with pytest.raises(ValueError):
        NgramDrafts(4, 2)


# --- the scheduler core with n-gram drafts ------------------------------------------------------

@pytest.mark.parametrize("cls", [Speculative, PipeInfer])
def test_ngram_drafts_through_the_core_are_exact_and_counted(cls):
    sched = make(cls)
    drive(sched, NgramDrafts(2, 4))
    gen, c = sched.gen, sched.gen.counters
    assert gen.tokens == TARGET[len(PROMPT):len(PROMPT) + 60]
    assert c.n_drafted == c.n_drafted_ngram > 0
    assert c.n_accepted == c.n_accepted_ngram > 0
    assert c.n_accepted_ngram > c.n_drafted_ngram / 3   # the repeats are predicted
    assert sched.pool.all_free


@pytest.mark.parametrize("cls", [Speculative, PipeInfer])
def test_both_sources_are_counted_apart(cls):
    sched = make(cls, source="both")
    drive(sched, NgramDrafts(2, 4, fallback=ScriptedModel(TARGET)))
    gen, c = sched.gen, sched.gen.counters
    assert gen.tokens == TARGET[len(PROMPT):len(PROMPT) + 60]
    assert 0 < c.n_drafted_ngram < c.n_drafted       # the new words came from the model
    assert 0 < c.n_accepted_ngram < c.n_accepted


def test_an_ngram_miss_does_not_move_the_cutoff():
    """The cutoff is the draft model's: nothing matching in the text says nothing about it."""
    sched = make(PipeInfer)
    log = drive(sched, NgramDrafts(2, 4))
    assert any(isinstance(a, A.StartDraft) for a in log)
    moves = [a for a in log if isinstance(a, A.PolicyChanged) and a.name == "cutoff"]
    assert not [a for a in moves if "failed" in a.why]
    assert all(a.value >= sched.opts.p_accept for a in moves)


# --- configuration and command line -----------------------------------------------------------

def test_default_sources():
    assert resolve_draft_source("pipeinfer", None, has_draft=False) == "ngram"
    assert resolve_draft_source("speculative", None, has_draft=True) == "both"
    assert resolve_draft_source("pipespec", None, has_draft=True) == "model"
    assert resolve_draft_source("iterative", None, has_draft=False) == "model"
    assert resolve_draft_source("pipeinfer", "model", has_draft=True) == "model"


@pytest.mark.parametrize("strategy, source, draft, fragment", [
    ("pipeinfer", "ngram", None, None),
    ("pipeinfer", "both", "d.gguf", None),
    ("iterative", "model", None, None),
    ("pipeinfer", "model", None, "--draft-source model needs a draft model (-md)"),
    ("pipespec", "ngram", "d.gguf", "needs a draft model's probabilities"),
    ("iterative", "ngram", None, "strategy iterative drafts nothing"),
    ("specpipe", "model", None, "--draft-source model needs a draft model (-md)"),
    ("specpipe", "ngram", None, None),
])
def test_library_config_checks(strategy, source, draft, fragment):
    cfg = JobConfig("m.gguf", (draft,) if draft else (), strategy,
                    spec=SpecOptions(draft_thread=False, draft_source=source))
    if fragment is None:
        cfg.check_drafts()
        assert cfg.uses_draft_model == (strategy != "iterative" and source != "ngram")
    else:
        with pytest.raises(ValueError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
            cfg.check_drafts()


CLI_ERRORS = [
    (["--strategy", "iterative", "--draft-source", "ngram"],
     "--draft-source ngram: strategy iterative drafts nothing"),
    (["--strategy", "pipespec", "-md", "DRAFT", "--draft-source", "ngram"],
     "strategy pipespec needs a draft model's probabilities"),
    (["--strategy", "pipespec", "-md", "DRAFT", "--draft-source", "both"],
     "strategy pipespec needs a draft model's probabilities"),
    (["--strategy", "pipeinfer", "--ngram-min", "5", "--ngram-max", "3"],
     "--ngram-min (5) is larger than --ngram-max (3)"),
    (["--strategy", "pipeinfer", "--ngram-max", str(NGRAM_LIMIT + 1)],
     f"{NGRAM_LIMIT + 1} is not in the range 1<=x<={NGRAM_LIMIT}"),
    (["--strategy", "speculative", "--ngram-min", "0"], "0 is not in the range"),
    (["--strategy", "pipeinfer", "--draft-source", "model"],
     "--draft-source model needs a draft model (-md)"),
    (["--strategy", "speculative", "--draft-source", "both"],
     "--draft-source both needs a draft model (-md)"),
]


@pytest.mark.parametrize("args, fragment", CLI_ERRORS,
                         ids=["iterative", "pipespec", "pipespec-both", "crossed", "too-long",
                              "zero", "model-without-md", "both-without-md"])
def test_cli_refuses(tiny_model, args, fragment):
    args = [str(tiny_model) if a == "DRAFT" else a for a in args]
    res = mpi_util.run_pipeinfer(None, tiny_model, "a b a b", *args, timeout=60)
    assert res.rc == 2 and not res.timed_out, res.describe()
    assert "Traceback" not in res.stderr, res.describe()
    errors = [line for line in res.stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and fragment in errors[0], res.describe()
    assert errors[0].startswith(("pipeinfer: error: ", "Error: ")), res.describe()


def test_cli_refusal_under_mpiexec_is_one_line(tiny_model):
    res = mpi_util.run_pipeinfer(2, tiny_model, "a b a b", "--strategy", "iterative",
                                 "--draft-source", "both", timeout=60)
    assert res.rc != 0 and not res.timed_out, res.describe()
    assert mpi_util.error_lines(res.stderr) == [
        "pipeinfer: error: --draft-source both: strategy iterative drafts nothing"]


def test_help_explains_the_options():
    res = mpi_util.launch([str(mpi_util.PIPEINFER), "run", "--help"], timeout=60)
    text = " ".join(res.stdout.split())
    for option in ("--draft-source [model|ngram|both]", "--ngram-min", "--ngram-max"):
        assert option in text
    assert "default: both with -md, else ngram" in text


# --- exact under mpiexec -------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.smollm2
@pytest.mark.parametrize("source", ["ngram", "both"])
@pytest.mark.parametrize("strategy", ["speculative", "pipeinfer"])
def test_exact_with_ngram_drafts(smollm2, smol_self_draft, code_oracle, tmp_path, strategy,
                                 source):
    md = ["-md", str(smol_self_draft)] if source == "both" else []   # ngram: the default
    csv_path = tmp_path / "runs.csv"
    # (without the guard: three ranks sharing two cores may make speculation slower than
    # plain decoding whatever the drafts, and the guard would rightly keep it paused)
    r = run(3, smollm2, CODE_PROMPT, "--strategy", strategy, "--layer-split", SPLIT, *md,
            "--no-guard", "--csv", csv_path, n_predict=N_CODE)
    assert r["tokens"] == code_oracle
    assert r["draft_source"] == source and r["partitions_free"] is True
    ngram, model = r["drafts"]["ngram"], r["drafts"]["model"]
    assert ngram["drafted"] > 0 and ngram["accepted"] > 0
    assert ngram["drafted"] + model["drafted"] == r["n_drafted"]
    assert ngram["accepted"] + model["accepted"] == r["n_accepted"]
    if source == "ngram":
        assert model["drafted"] == 0
    if source == "both" and strategy == "speculative":   # synchronous: no timing involved
        assert model["drafted"] > 0
    with open(csv_path, newline="") as handle:
        row = next(csv.DictReader(handle))
    assert int(row["n_drafted_ngram"]) == ngram["drafted"]
    assert int(row["n_accepted_ngram"]) == ngram["accepted"]
    assert row["draft_source"] == source


def test_tiny_model_without_a_draft_is_exact(tiny_model):
    """No -md at all: speculative drafts n-grams, with the oracle's tokens (the tiny
    random model repeats itself rarely, so few drafts are right; exactness is the point)."""
    r = run(2, tiny_model, "the number of people in the world " * 3, "--strategy",
            "speculative", n_predict=40)
    assert r["tokens"] == oracle(tiny_model, r["prompt_tokens"], 40)
    assert r["draft_source"] == "ngram" and r["n_drafted_ngram"] == r["n_drafted"] > 0
