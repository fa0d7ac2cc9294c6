"""What a finished run reports: the JSON object of `--json`, the stderr summary line, and the
fields of its CSV row (metrics.CsvRow)."""

from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path

from ..model.partition import format_split


def _round(value, digits=6):
    return None if value is None else round(value, digits)


def repacked(cfg) -> bool:
    """Whether the target stages' weights were repacked (llama_lib.repacks)."""
    from ..model.llama_lib import repacks
    return repacks(cfg.repack_target)


def result_json(cfg, gen, setup, ranges, stats, wall: float) -> dict:
    tl, counters = gen.timeline, gen.counters
    n_prompt = len(setup.prompt)
    prefill_s = tl.prefill_s
    busy = [s.get("busy_s", 0.0) / wall if wall > 0 else 0.0 for s in stats]
    return {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "strategy": cfg.strategy,
        "target": Path(cfg.model).name,
        "draft": ",".join(Path(d).name for d in cfg.drafts),
        "compact_draft": cfg.compact_draft if cfg.drafts else None,   # (None: no draft)
        "draft_vocab": cfg.draft_vocab if cfg.drafts else None,       # (0: the full one)
        "n_ranks": len(ranges) + cfg.draft_ranks,
        "ranks": len(ranges) + cfg.draft_ranks,
        "draft_ranks": cfg.draft_ranks,
        "layer_split": [[r.first, r.last] for r in ranges],
        "split": format_split([r.n_layer / ranges[-1].last for r in ranges])
        + "/1" * cfg.draft_ranks,
        "threads": ",".join(str(cfg.threads_for(r.rank)) for r in ranges),
        "repack": repacked(cfg),
        "exact": cfg.exact,
        "max_run": cfg.max_run,
        "row_costs": [round(c, 3) for c in setup.pipeline.row_costs],
        "prompt_tokens": list(setup.prompt),
        "tokens": list(gen.tokens),
        "text": setup.tokenizer.detokenize(gen.tokens),
        "n_prompt": n_prompt,
        "n_generated": len(gen.tokens),
        "stop_reason": gen.stop_reason,
        "prefill_tps": _round(n_prompt / prefill_s if prefill_s > 0 else None, 3),
        "speed_tps": _round(tl.speed_tps, 3),
        "ttft_s": _round(tl.ttft_s),
        "itl_s": _round(tl.itl_s),
        "accept_rate": _round(counters.accept_rate, 4),
        "verified_accept_rate": _round(counters.verified_accept_rate, 4),
        "mean_microbatch": _round(counters.mean_microbatch, 3),
        "hit_rate": _round(counters.hit_rate, 4),
        "mean_tree_size": _round(counters.mean_tree_size, 3),
        **asdict(counters),
        "draft_source": cfg.spec.draft_source if cfg.speculates else "",
        "drafts": drafts_by_source(counters),
        "busy_fraction": ",".join(f"{b:.3f}" for b in busy),
        **head_cpu(tl, len(gen.tokens)),
        "peak_rss_mb": ",".join(f"{s.get('peak_rss_mb') or 0:.0f}" for s in stats),
        "rank_stats": stats,
        "wall_s": _round(wall, 4),
        "partitions_free": setup.pool.all_free if setup.pool else None,
        "stage_computations": {k: sum(s.get(k, 0) for s in stats)
                               for k in ("computed", "skipped", "aborted")},
        "label": cfg.output.label,
        **getattr(gen, "extras", {}),  # strategy-specific (pipespec: per-stage rates)
    }


def head_cpu(tl, n_generated: int) -> dict:
    """The head's CPU per generated token, in ms: its process in all (prefill included, and
    whatever else its threads did meanwhile, e.g. loading the draft model), the draft model's
    jobs, and the driver's loop (scheduling, sampling, transport)."""
    if tl.head_cpu_s is None or not n_generated:
        return {}
    per = 1000 / n_generated
    out = {"head_cpu_ms_per_token": _round(tl.head_cpu_s * per, 3)}
    if tl.draft_cpu_s is not None:   # (executors that cannot tell: the total only)
        out["draft_cpu_ms_per_token"] = _round(tl.draft_cpu_s * per, 3)
    if tl.loop_cpu_s is not None:
        out["head_loop_cpu_ms_per_token"] = _round(tl.loop_cpu_s * per, 3)
    return out


def drafts_by_source(counters) -> dict:
    """Drafted and accepted tokens per draft source: the draft model, the n-gram lookup."""
    ngram = (counters.n_drafted_ngram, counters.n_accepted_ngram)
    model = (counters.n_drafted - ngram[0], counters.n_accepted - ngram[1])
    return {name: {"drafted": drafted, "accepted": accepted,
                   "accept_rate": _round(accepted / drafted if drafted else None, 4)}
            for name, (drafted, accepted) in (("model", model), ("ngram", ngram))}


def _ms(seconds) -> str:
    return "n/a" if seconds is None else f"{seconds * 1000:.1f} ms"


def summary_line(r: dict) -> str:
    line = (f"pipeinfer: {r['strategy']} on {r['n_ranks']} rank(s): prompt {r['n_prompt']} tokens "
            f"at {r['prefill_tps'] or 0:.1f} t/s; generated {r['n_generated']} tokens at "
            f"{r['speed_tps'] or 0:.2f} t/s; TTFT {_ms(r['ttft_s'])}; ITL {_ms(r['itl_s'])}")
    if r["accept_rate"] is not None:
        line += f"; acceptance {r['accept_rate']:.2f}"
        if r.get("n_unverified"):  # runs were cancelled: what verification itself accepted
            line += (f" ({r['verified_accept_rate'] or 0:.2f} of the verified, "
                     f"{r['n_unverified']} drafted token(s) cancelled unverified)")
    if r.get("n_drafted_ngram"):
        line += (f"; n-gram drafts: {r['n_accepted_ngram']} of {r['n_drafted_ngram']} "
                 "tokens accepted")
    if r.get("hit_rate") is not None:  # specpipe
        line += (f"; tree hit rate {r['hit_rate']:.2f}, {r['flushes']} flush(es), "
                 f"mean tree size {r['mean_tree_size']:.1f}")
    if r.get("pipespec_stages"):
        line += "\n" + pipespec_lines(r)
    return line


def pipespec_lines(r: dict) -> str:
    """Per-stage rates of a pipespec run and PipeSpec's analytic expectation (eq. 1-3)."""
    lines = []
    for i, s in enumerate(r["pipespec_stages"]):
        rate = "-" if s["rate"] is None else f"{s['rate']:.2f}"
        tps = "-" if s["tokens_per_s"] is None else f"{s['tokens_per_s']:.1f}"
        step = "-" if s["step_s"] is None else f"{s['step_s'] * 1000:.2f} ms"
        lines.append(f"pipespec: M{i} {s['model']} ({s['role']}): accepted {s['accepted']}/"
                     f"{s['proposed']} (alpha {rate}), produced {s['produced']} in "
                     f"{s['steps']} steps of {step}, {tps} t/s, {s['rollbacks']} rollbacks")
    e = r.get("pipespec_expected") or {}
    if e.get("speedup_vs_ar") is not None:
        tps = "-" if e["expected_tps"] is None else f"{e['expected_tps']:.2f}"
        lines.append(f"pipespec: expected (eq. 1-3): {e['speedup_vs_ar']:.3f} tokens per "
                     f"target step, {tps} t/s")
    return "\n".join(lines)
