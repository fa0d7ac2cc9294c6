"""`pipeinfer run`: its options, checked and wired into the job's configuration; the run
itself is runner.py."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from ..job import supervisor
from .commands import Failure, RankedCommand, checked_value, setup_logging, verbosity_options
from .options import (AUTO_SPLIT_HELP, PROFILE_HELP, REQUEST, SPLIT_HELP, model_options,
                      parse_run_split, sampling_options, size_options, speculation,
                      speculation_options, strategy_option)


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
@model_options
@click.option("-p", "--prompt", default=None, help="Prompt text.")
@click.option("-f", "--file", "prompt_file", type=click.Path(dir_okay=False), default=None,
              help="Read the prompt from this file instead.")
@click.option("-n", "--n-predict", default=REQUEST.n_predict, type=int,
              help="Tokens to generate.")
@size_options
@sampling_options("")
@click.option("--layer-split", "split", default=None, callback=parse_run_split,
              help=SPLIT_HELP + " pipespec only: append /1 per draft model (-md, smallest "
              "first) to run it on a rank of its own after the target's ranks, e.g. "
              "0,0.5,0.5/1/1 for 5 ranks (else the draft models run in the head process)."
              + AUTO_SPLIT_HELP)
@click.option("--profile", type=click.Path(dir_okay=False), default=None, help=PROFILE_HELP)
@strategy_option
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
def run(model, draft, compact_draft, draft_vocab, prompt, prompt_file, n_predict, n_ctx,
        n_batch, prefill_chunk, prefill_tail, seed, temp, top_k, top_p, threads, split,
        profile, strategy, trace_path, ignore_eos, chat, csv_path, as_json, label, verbose,
        quiet, **speculation_values):
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
    from ..config.job import JobConfig
    from ..config.run import OutputConfig, RequestConfig
    from ..engine.transport.mpi import world
    from ..model.sampling import SamplingParams
    from .runner import main as run_main

    setup_logging(verbose, quiet, rank=world()[0])
    if (prompt is None) == (prompt_file is None):
        raise Failure("give the prompt with exactly one of -p or -f", 2)
    if prompt_file is not None:
        prompt = _read_prompt(prompt_file)
    request = RequestConfig(prompt, chat, n_predict, ignore_eos,
                            SamplingParams(temp, top_k, top_p, seed))
    output = OutputConfig(csv_path, as_json, label, trace_path, verbose, summary=not quiet)
    cfg = JobConfig(model, tuple(draft), strategy, split=split[0], draft_ranks=split[1],
                    profile=profile, threads=threads, n_ctx=n_ctx, n_batch=n_batch,
                    prefill_chunk=prefill_chunk, prefill_tail=prefill_tail,
                    compact_draft=compact_draft, draft_vocab=draft_vocab, request=request,
                    output=output,
                    **checked_value(speculation, speculation_values, strategy, bool(draft)))
    checked_value(cfg.check)
    sys.exit(run_main(cfg))
