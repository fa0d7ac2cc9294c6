"""`--layer-split auto`: the profile of the job's ranks (given, cached, or measured now), then
the solver's split. Collective: every rank of the job calls `auto_split` at the same point."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Sequence

from .. import strategies
from ..engine.transport.mpi import Link, hostname
from ..engine.files.draft_files import draft_file as job_draft_file
from ..model.models import ModelError, resolve_model
from ..model.slicing import model_info, read_model
from . import calibrate as cal
from .cost import Pipeline, draft_tokens, drafts_on_thread
from .profile import Profile, ProfileError, cache_path, load
from .shape import model_shape
from .solver import Split, solve

log = logging.getLogger(__name__)


def obtain_profile(link: Link, path: str | None, model: Path, draft: Path | None,
                   threads: list[int], repack: bool = True, given: str | None = None) -> Profile:
    """The job's profile on every rank: `path` if given and present (checked against the
    model and hosts), else the cached one for these hosts if a quick probe finds every
    rank's speed unchanged, else measured now (and saved to `path` and the cache). `model`
    and `draft` are rank 0's files: no other rank needs them (calibration sends the slices
    it times); `given` is what this rank was given as -m."""
    hosts = link.bcast(link.gather(hostname()))

    def facts():
        info = model_info(read_model(model), model)
        mid = cal.model_id(model, info.n_layer)
        cached = cache_path(hosts, threads, mid, cal.model_id(draft) if draft else None)
        return info, cached, _read(path, cached, mid, hosts)

    info, cached, verdict = cal.from_rank0(link, facts)
    if isinstance(verdict, str):
        raise ProfileError(verdict)
    if verdict is not None and path is None:
        changed = cal.probe_changed(link, verdict, model, info.n_layer, threads, repack, given)
        if changed and link.rank == 0:
            log.info("measuring again: %s", changed)
        verdict = None if changed else verdict
    if verdict is None:
        verdict = cal.calibrate(link, model, info.n_layer, info.n_embd, threads, draft,
                                repack, given)
        if link.rank == 0:
            for where in filter(None, (path, cached)):
                verdict.save(where)
        verdict = link.bcast(verdict)
    return verdict


def _read(path: str | None, cached: Path, mid, hosts) -> Profile | str | None:
    """The profile to use (or an error sentence, or None: measure)."""
    if path is not None and not Path(path).exists():
        return None
    try:
        profile = load(path or cached) if path or cached.exists() else None
        if profile is not None:
            profile.check(mid, hosts, where=f"profile {path or cached}")
            why = profile.outdated()
            if why and path is None:
                log.info("measuring again: the cached profile %s", why)
                return None
            if why:
                log.warning("profile %s %s: measure it again with `pipeinfer calibrate` for "
                            "better splits", path, why)
        return profile
    except ProfileError as err:
        if path is None:
            return None  # a stale cache entry: measure again
        return str(err)


def pipeline_for(profile: Profile, model: Path, strategy: str, draft: Path | None,
                 kv_cells: int) -> Pipeline:
    """The cost model of `profile`'s nodes running `model` with `strategy`."""
    head_mb = draft.stat().st_size / 2 ** 20 if draft else 0.0
    shape = model_shape(model, kv_cells, head_mb=head_mb)
    return Pipeline(profile.costs(), shape, draft_tokens(strategy, draft is not None),
                    drafts_on_thread(strategy))


def auto_split(link: Link, cfg, drafts: Sequence = ()) -> tuple[tuple[float, ...], dict]:
    """The solver's split for `cfg` (a JobConfig) on this job's ranks, and what it predicts
    (predicted()); logged on rank 0 with what the nodes left out would give. `drafts`: on
    rank 0 the job's draft files, settled with `cfg` (engine/files/draft_files.py), the
    first of which the profile times."""
    model = target_file(link, cfg.model)
    draft = head_draft(link, cfg, drafts) if cfg.uses_draft_model else None
    threads = [cfg.threads_for(r) for r in range(link.size)]
    profile = obtain_profile(link, cfg.profile, model, draft, threads, cfg.repack_target,
                             given=cfg.model)
    answer = None
    if link.rank == 0:
        try:
            pipe = pipeline_for(profile, model, cfg.strategy, draft, cfg.kv_size)
            split = solve(pipe, cfg.strategy, may_drop=True, keep_worker=True)
            _report(split, profile)
            answer = (tuple(split.fractions), predicted(split))
        except ValueError as err:
            answer = str(err)
    answer = link.bcast(answer)
    if isinstance(answer, str):
        raise ProfileError(answer)
    return answer


def predicted(split: Split) -> dict:
    """What the split's bound predicts, for the console beside the measured speed: a step of
    `step` tokens every `bound_ms` (the sum of stage times, or the slowest stage's), that is
    `tokens_per_s` for one request with every drafted token accepted."""
    bound = strategies.get(split.strategy).bound
    return {"bound": bound, "bound_ms": round(split.bound_ms, 3), "step": split.step,
            "tokens_per_s": round(1e3 * split.step / split.bound_ms, 3)
            if split.bound_ms > 0 else None}


def target_file(link: Link, name: str) -> Path:
    """Rank 0's file of the target (fetched there if it is a registry name not cached yet),
    the path shared (only rank 0 opens it; an unusable model raises ModelError on every
    rank)."""
    return Path(cal.from_rank0(link, lambda: str(resolve_model(name))))


def head_draft(link: Link, cfg, drafts: Sequence) -> Path:
    """The draft file the head will run (its reduced copy for --draft-vocab K, made now if
    new), so that the profile times the draft as it will draft; rank 0's path shared."""
    return Path(cal.from_rank0(link, lambda: str(drafts[0].head_file(cfg.draft_vocab)),
                               (ModelError,)))


def draft_file(link: Link, name: str, compact: bool) -> Path:
    """The draft file `run` will load (its compact copy by default, engine/files/draft_files.py),
    so the profile times the draft the head will run; made once on rank 0, the path shared
    (an unusable draft raises ModelError on every rank)."""
    return Path(cal.from_rank0(link, lambda: str(job_draft_file(name, compact).path),
                               (ModelError,)))


def _report(split: Split, profile: Profile) -> None:
    kind = "sum of stage times" if strategies.get(split.strategy).bound == "sum" \
        else "slowest stage"
    log.info("--layer-split auto: %s (layers %s; predicted %s %.1f ms per %d-token step)",
             split.layer_split, ",".join(map(str, split.counts)), kind, split.bound_ms,
             split.step)
    if split.dropped:
        names = ", ".join(f"rank {r} ({profile.nodes[r].host})" for r in split.dropped)
        log.warning("%s would only slow the pipeline: no layers, out of the chain (rank %d "
                    "is the last stage)", names, split.last)
