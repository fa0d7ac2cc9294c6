"""Long help texts and option groups of `pipeinfer run`, kept apart so that cli.py stays the
wiring of options into a RunConfig. Imports nothing heavy: `--help` stays fast."""

from __future__ import annotations

import click

from .model import partition
from .schedule.options import DRAFT_SOURCES, NGRAM_LIMIT, NGRAM_MAX, NGRAM_MIN

# The names of pipeinfer.strategies.STRATEGIES, without importing llama.cpp for --help.
STRATEGY_NAMES = ("iterative", "speculative", "pipeinfer", "pipespec", "specpipe")

SPLIT_HELP = ("Comma-separated fraction of the target's layers per rank, in rank order "
              "(must sum to 1). Rank r gets layers [round(L*(F0+..+F(r-1))), "
              "round(L*(F0+..+Fr))), rounding halves up. Only rank 0 may get 0 (it then "
              "only drafts and samples). Default: stages of equal weight with the output matrix "
              "counted (so the last rank gets fewer layers); rank 0 gets none when it runs a "
              "draft model.")

DRAFT_MODEL_HELP = ("Draft model (path or cached name), same vocabulary as the target; "
                    "needed by pipespec, optional for speculative, pipeinfer and specpipe "
                    "(see --draft-source). pipespec: repeat it for a model hierarchy, smallest "
                    "first (-md M0 -md M1 ...); the others use the first.")

STRATEGY_HELP = ("iterative: pipeline-parallel decoding, one token per pass. speculative: "
                 "draft a token tree, verify it in one pass, repeat (synchronous). pipeinfer: "
                 "asynchronous continuous speculation in micro-batches with KV multibuffering "
                 "and early cancellation. pipespec: a hierarchy of draft models (PipeSpec), "
                 "each verifying the one before it, the target verifying the last. "
                 "specpipe: SpecPipe/PipeDec, one level of a fixed-width draft tree per "
                 "pipeline step, rerooted on a hit, flushed on a miss (--tree-width, "
                 "--tree-k). All are exact under greedy sampling.")

DRAFT_SOURCE_HELP = (
    "speculative, pipeinfer and specpipe: where drafts come from. model: the draft model "
    "(-md). ngram: the text itself (prompt lookup, no draft model): the longest suffix of the "
    "text so far (prompt, generated and speculated tokens) of --ngram-max down to --ngram-min "
    "tokens that occurred before is found at its latest place, and what followed it there is "
    "the draft (specpipe: every token that followed it is a candidate for the tree, the most "
    "frequent first); it costs nothing on the head and pays off where the output repeats the "
    "prompt (editing code, rewriting a text). both: the n-gram draft where one matches, else "
    "the draft model. [default: both with -md, else ngram; pipespec takes the model only]")


def draft_source_options(command):
    """--draft-source, --ngram-min, --ngram-max."""
    options = [
        click.option("--draft-source", type=click.Choice(DRAFT_SOURCES), default=None,
                     help=DRAFT_SOURCE_HELP),
        click.option("--ngram-min", default=NGRAM_MIN, type=click.IntRange(1, NGRAM_LIMIT),
                     help="n-gram drafts: the shortest suffix looked up (fewer tokens match "
                          "more often, and more often wrongly)."),
        click.option("--ngram-max", default=NGRAM_MAX, type=click.IntRange(1, NGRAM_LIMIT),
                     help="n-gram drafts: the longest suffix looked up (tried first; at "
                          "least --ngram-min)."),
    ]
    for option in reversed(options):  # listed in --help in this order
        command = option(command)
    return command


# --- option callbacks: values checked and converted, errors as click's bad-parameter lines --
def parse_split(ctx, param, value):
    if value is None:
        return None
    try:
        return tuple(partition.parse_split(value))
    except partition.PartitionError as err:
        raise click.BadParameter(str(err)) from None


def parse_run_split(ctx, param, value):
    """`run`'s split: (target fractions, number of draft ranks)."""
    if value is None:
        return None, 0
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
