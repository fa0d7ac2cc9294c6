"""What `plan` and `simulate` work from: the cluster's nodes (a profile, or modelled nodes), the
model's shape, the split to simulate, the draft's acceptance. Library code: raises CostError
(or ProfileError) with a one-line message; the commands turn it into an error line."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from .. import strategies
from ..model.balance import balanced_split
from ..config.drafts import AUTO, draft_vocab_for
from ..model.draft_cache import compact_draft
from ..model.draft_vocab import reduced_draft
from ..model.gguf_header import HeaderError, read_header
from ..model.models import ModelError, resolve_model
from ..model.partition import PartitionError, parse_split, partition
from ..model.slicing import SliceError, model_info
from ..model.stage_cache import content_digest
from . import modelled
from .cost import CostError, ModelShape, NodeCost, Pipeline, draft_tokens, drafts_on_thread
from .profile import ModelId, load
from .shape import model_shape
from .solver import solve

REFERENCE = "qwen-coder-1.5b"   # whose measured cost per byte scales a header-only model


@dataclass(frozen=True)
class Setup:
    nodes: tuple[NodeCost, ...]
    shape: ModelShape
    model: Path
    draft: Path | None
    hosts: tuple[str, ...] | None = None   # from a profile: the hosts, rank order
    threads: tuple[int, ...] = (1,)
    draft_named: Path | None = None        # the draft file named (`draft` may be its compact copy)
    compact: bool = True                   # the draft costed as run loads it by default
    timed_draft: str | None = None         # sha256 of the draft file the nodes' draft_ms timed
    draft_vocab: int = 0                   # `draft` is the reduced copy over K tokens (0: not)
    embeddings: Path | None = None         # a reduced draft's full file (its input rows)

    def pipeline(self, strategy: str | None = None) -> Pipeline:
        """The cost model; with a strategy, the head's drafting is counted on it (for the
        solver); without, not (the simulator models the draft itself)."""
        tokens = draft_tokens(strategy, self.draft is not None) if strategy else 0
        return Pipeline(self.nodes, self.shape, tokens, drafts_on_thread(strategy))


def resolve(name: str, what: str) -> Path:
    try:
        path = resolve_model(name, fetch_missing=False)
        read_header(path)
        return path
    except (ModelError, HeaderError, OSError, TypeError) as err:
        raise CostError(f"{what} {name}: {err}") from None


@dataclass(frozen=True)
class ClusterSpec:
    """The models and the nodes `plan` and `simulate` cost, as the command line gives them:
    the nodes of a calibration `profile`, or modelled ones, each a `cpus` share of one of
    this machine's cores, joined by `link`, named by `hosts` (a hostfile's) and limited to
    `memory` free MB each (else not limited). `reference`: a model with weights whose cost per
    byte scales a header-only `model`. `compact`: the draft as `run` loads it by default (its
    compact copy), else the file as it is."""
    model: str
    draft: str | None = None
    profile: str | None = None
    n_nodes: int | None = None        # with a profile: how many of its nodes
    cpus: tuple[float, ...] | None = None
    link: str = "none"
    reference: str | None = None
    hosts: tuple[str, ...] | None = None
    memory: tuple[float, ...] | None = None
    compact: bool = True


def cluster(spec: ClusterSpec, kv_cells: int = 8192) -> Setup:
    """The nodes and the model's shape (from its GGUF header) of `spec`."""
    model, draft, profile = spec.model, spec.draft, spec.profile
    compact, hosts, memory = spec.compact, spec.hosts, spec.memory
    target = resolve(model, "model (-m)")
    named = resolve(draft, "draft model (-md)") if draft else None
    draft_path = _draft(named, compact) if named else None
    head_mb = draft_path.stat().st_size / 2 ** 20 if draft_path else 0.0
    try:
        shape = model_shape(target, kv_cells, header=read_header(target), head_mb=head_mb)
    except (SliceError, HeaderError) as err:
        raise CostError(str(err)) from None
    if profile is not None:
        return replace(_from_profile(profile, target, draft_path, shape, spec.n_nodes),
                       draft_named=named, compact=compact)
    if spec.cpus is None:
        raise CostError("give --profile, or the nodes: --nodes N --cpu F, or --cpus F0,F1,..")
    layer, output = (modelled.local_layers(target) if modelled.has_weights(target) else
                     modelled.scaled_layers(target, _reference(spec.reference)))
    draft_ms = modelled.local_draft_ms(draft_path) if draft_path else 0.0
    nodes = modelled.nodes(list(spec.cpus), layer, output, draft_ms,
                           modelled.parse_link(spec.link))
    if hosts is not None:
        nodes = tuple(replace(n, name=f"{h}:{r}") for r, (n, h) in enumerate(zip(nodes, hosts)))
    if memory is not None:
        nodes = tuple(replace(n, memory_mb=m) for n, m in zip(nodes, memory))
    else:  # not limited: the runtime's own share does not matter either
        shape = replace(shape, base_mb=0.0)
    return Setup(nodes, shape, target, draft_path, tuple(hosts) if hosts else None,
                 draft_named=named, compact=compact,
                 timed_draft=_digest(draft_path) if draft_path else None)


def for_strategy(setup: Setup, strategy: str, draft_vocab: int | str = AUTO) -> Setup:
    """`setup` with the draft the head of a `strategy` job on these nodes drafts with: the
    reduced-vocabulary copy where `run`'s --draft-vocab (`draft_vocab`) settles on a K
    (config/job.py), its time per token the timed draft's scaled by what this machine
    measures for the two files, else `setup` itself."""
    if (setup.draft is None or not strategies.get(strategy).speculates
            or not modelled.has_weights(setup.draft)):
        return setup
    header = read_header(setup.draft)
    k = draft_vocab_for(draft_vocab, strategy, model_info(header, setup.draft).n_vocab,
                        len(setup.nodes))
    if not k:
        return setup
    try:
        reduced = reduced_draft(setup.draft, k, header=header)
    except ModelError as err:
        raise CostError(f"--draft-vocab {k}: {err}") from None
    nodes, digest = setup.nodes, _digest(reduced)
    if setup.timed_draft != digest:
        ratio = modelled.local_draft_ms(reduced) / modelled.local_draft_ms(setup.draft)
        nodes = tuple(replace(n, draft_ms=n.draft_ms * ratio) for n in nodes)
    return replace(setup, nodes=nodes, draft=reduced, timed_draft=digest, draft_vocab=k,
                   embeddings=setup.draft)


def _digest(path: Path) -> str:
    return content_digest(path)[:32]


def _draft(path: Path, compact: bool) -> Path:
    """The draft file `run` loads by default: the compact copy (model/draft_cache.py), whose
    time per token and agreement are what the head will see."""
    try:
        return compact_draft(path) if compact and modelled.has_weights(path) else path
    except ModelError as err:
        raise CostError(f"draft model (-md) {path.name}: {err}") from None


def _reference(name: str | None) -> Path:
    path = resolve(name or REFERENCE, "reference model (--reference)")
    if not modelled.has_weights(path):
        raise CostError(f"reference model {path.name} has no weights: give --reference a "
                        "GGUF file with weights (its measured cost per byte scales the model)")
    return path


def _from_profile(path: str, target: Path, draft: Path | None, shape: ModelShape,
                  n_nodes: int | None) -> Setup:
    prof = load(path)
    prof.check(ModelId(target.name, content_digest(target)[:32]), where=f"profile {path}")
    if n_nodes is not None and n_nodes != len(prof.nodes):
        raise CostError(f"profile {path} has {len(prof.nodes)} nodes, not --nodes {n_nodes}")
    if draft is not None and prof.nodes[0].draft_ms <= 0:
        raise CostError(f"profile {path} has no draft model time: calibrate with -md")
    return Setup(prof.costs(), shape, target, draft, tuple(prof.hosts),
                 tuple(n.threads for n in prof.nodes),
                 timed_draft=prof.draft.sha256 if prof.draft else None)


def counts_for(setup: Setup, strategy: str, split: str | None) -> list[int]:
    """Layers per node: `split` as fractions, "auto" (the solver, every node kept), or run's
    default (stages of equal weight; the head holds none when it runs a draft model)."""
    n, n_layer = len(setup.nodes), setup.shape.n_layer
    try:
        if split == "auto":
            return list(solve(setup.pipeline(strategy), strategy, may_drop=False).counts)
        if split is None:
            header = read_header(setup.model)
            head_layers = (n == 1 or not strategies.get(strategy).speculates
                           or setup.draft is None)
            if (n if head_layers else n - 1) > n_layer:
                raise CostError(f"{n} nodes but the model has only {n_layer} layers: every "
                                "node after the head needs at least one")
            fractions = balanced_split(header, model_info(header, setup.model).n_layer, n,
                                       head_layers)
        else:
            fractions = parse_split(split)
            if len(fractions) != n:
                raise CostError(f"--layer-split has {len(fractions)} fractions for {n} nodes")
        # (a worker without layers is out of the chain, as `run --layer-split auto` leaves it)
        counts = [r.n_layer for r in partition(n_layer, fractions, allow_empty=True)]
    except PartitionError as err:
        raise CostError(str(err)) from None
    check_memory(setup, counts)
    return counts


def check_memory(setup: Setup, counts: list[int]) -> None:
    """CostError naming the first node whose share does not fit its memory, and the fix."""
    pipe, m = setup.pipeline(), setup.shape
    last = max(r for r, c in enumerate(counts) if c > 0)
    for rank, k in enumerate(counts):
        cap = pipe.memory_cap(rank, rank == last)
        if k > 0 and k > cap:
            node = setup.nodes[rank]
            holds = "not even the output layer" if cap < 0 else f"at most {cap} layers"
            raise CostError(
                f"node {rank} ({node.name}) has {node.memory_mb:.0f} MB free: it holds {holds} "
                f"of {m.name} ({m.layer_mb:.0f} MB a layer"
                + (f", output layer {m.output_mb:.0f} MB" if rank == last else "")
                + f"), not {k}: give it a smaller share or more memory, or --layer-split auto")
