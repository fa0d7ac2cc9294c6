"""A cluster's calibration profile: per rank the measured figures of cost.NodeCost, for one
model (and draft model) on one set of hosts, as a JSON file.

    {"version": 1, "model": {"name", "sha256", "n_layer"}, "draft": {...} | null,
     "created": "...", "nodes": [{"rank", "host", "threads", "layer_ms": {"1": ..},
     "output_ms": {..}, "draft_ms", "free_mb", "link_rtt_ms", "link_mb_s", "cores"}, ...]}

layer_ms has the steps of cost.STEP_SIZES and the prompt chunk's (cost.PREFILL_STEP), which
`simulate` and `plan` need to cost a prompt: for a profile without it they say to calibrate
again. `--layer-split auto` needs only the small steps.

Profiles are cached per host set and model (`cache_path`): the same hosts under other CPU
quotas measure differently, which the quick probe of calibrate.py finds.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..model.models import cache_dir
from .cost import STEP_SIZES, NodeCost

VERSION = 1


class ProfileError(ValueError):
    """A profile that cannot be used here; the message says why and what to do."""


@dataclass(frozen=True)
class NodeFigures:
    rank: int
    host: str
    threads: int
    layer_ms: dict[int, float]
    output_ms: dict[int, float]
    free_mb: float
    link_rtt_ms: float = 0.0
    link_mb_s: float = 0.0       # 0: no link measured (a single rank)
    draft_ms: float = 0.0
    cores: float = 0.0           # the CPU the rank could use (cgroup quota, affinity); 0: unknown

    def cost(self) -> NodeCost:
        return NodeCost(f"{self.host}:{self.rank}", dict(self.layer_ms), dict(self.output_ms),
                        self.free_mb, self.link_rtt_ms, self.link_mb_s or float("inf"),
                        self.draft_ms, self.cores or None)


@dataclass(frozen=True)
class ModelId:
    name: str
    sha256: str
    n_layer: int = 0


@dataclass(frozen=True)
class Profile:
    model: ModelId
    draft: ModelId | None
    nodes: tuple[NodeFigures, ...]
    created: str = ""
    version: int = VERSION
    extra: dict = field(default_factory=dict)

    @property
    def hosts(self) -> list[str]:
        return [n.host for n in self.nodes]

    def costs(self) -> tuple[NodeCost, ...]:
        return tuple(n.cost() for n in self.nodes)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, allow_nan=False)

    def save(self, path: str | os.PathLike) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + f".tmp{os.getpid()}")
        tmp.write_text(self.to_json() + "\n")
        os.replace(tmp, path)

    def outdated(self) -> str | None:
        """What this profile lacks that calibration measures now (None: nothing): profiles
        of older versions had no 3-token step (every speculative run's size under --exact,
        which interpolation misjudged by 30 %) and no CPU per rank."""
        for node in self.nodes:
            missing = sorted(set(STEP_SIZES) - set(node.layer_ms))
            if missing:
                return f"has no layer times for steps of {missing} tokens"
            if not node.cores:
                return "does not know the ranks' CPU"
        return None

    def check(self, model: ModelId, hosts: list[str] | None = None, where: str = "") -> None:
        """ProfileError unless the profile was measured for `model` on `hosts` (rank order)."""
        where = where or "the profile"
        fix = "measure again with `pipeinfer calibrate` (or drop --profile)"
        if self.model.sha256 != model.sha256:
            raise ProfileError(f"{where} was measured for the model {self.model.name}, not "
                               f"{model.name}: {fix}")
        if hosts is None:
            return
        if len(hosts) != len(self.nodes):
            raise ProfileError(f"{where} has {len(self.nodes)} nodes but the job has "
                               f"{len(hosts)} ranks: {fix}")
        for rank, (had, now) in enumerate(zip(self.hosts, hosts)):
            if had != now:
                raise ProfileError(f"{where}: rank {rank} was measured on host {had}, but runs "
                                   f"on {now} now: {fix}")


def load(path: str | os.PathLike) -> Profile:
    """Read a profile; ProfileError (one line) if it is missing or malformed."""
    try:
        data = json.loads(Path(path).read_text())
    except OSError as err:
        raise ProfileError(f"cannot read profile {path}: {err.strerror}") from None
    except ValueError as err:
        raise ProfileError(f"profile {path} is not JSON: {err}") from None
    try:
        return from_dict(data)
    except (KeyError, TypeError, ValueError) as err:
        raise ProfileError(f"profile {path} is malformed ({type(err).__name__}: {err}); "
                           "measure it again with `pipeinfer calibrate`") from None


def from_dict(data: dict) -> Profile:
    if data.get("version") != VERSION:
        raise ValueError(f"version {data.get('version')!r}, expected {VERSION}")
    nodes = []
    for n in data["nodes"]:
        n = dict(n)
        for key in ("layer_ms", "output_ms"):
            n[key] = {int(b): float(ms) for b, ms in n[key].items()}
            if not n[key] or any(ms < 0 for ms in n[key].values()):
                raise ValueError(f"node {n['rank']}: {key} is empty or negative")
        nodes.append(NodeFigures(**n))
    if [n.rank for n in nodes] != list(range(len(nodes))) or not nodes:
        raise ValueError("nodes must be ranks 0, 1, ... in order")
    draft = ModelId(**data["draft"]) if data.get("draft") else None
    return Profile(ModelId(**data["model"]), draft, tuple(nodes), data.get("created", ""),
                   extra=data.get("extra", {}))


def cache_path(hosts: list[str], threads: list[int], model: ModelId,
               draft: ModelId | None) -> Path:
    """Where the profile of this host set (rank order), thread counts and models is kept."""
    key = json.dumps([hosts, threads, model.sha256, draft.sha256 if draft else None])
    return cache_dir() / "profiles" / (hashlib.sha256(key.encode()).hexdigest()[:24] + ".json")
