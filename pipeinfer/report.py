"""What a finished run reports: the JSON object of `--json`, the stderr summary line, and the
fields of its CSV row (metrics.CsvRow)."""

from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path

from .partition import format_split


def _round(value, digits=6):
    return None if value is None else round(value, digits)


def result_json(cfg, gen, setup, ranges, stats, wall: float) -> dict:
    tl, counters = gen.timeline, gen.counters
    n_prompt = len(setup.prompt)
    prefill_s = tl.prefill_s
    busy = [s.get("busy_s", 0.0) / wall if wall > 0 else 0.0 for s in stats]
    return {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "strategy": cfg.strategy,
        "target": Path(cfg.model).name,
        "draft": Path(cfg.draft).name if cfg.draft else "",
        "n_ranks": len(ranges),
        "ranks": len(ranges),
        "layer_split": [[r.first, r.last] for r in ranges],
        "split": format_split([r.n_layer / ranges[-1].last for r in ranges]),
        "threads": ",".join(str(cfg.threads_for(r.rank)) for r in ranges),
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
        "mean_microbatch": _round(counters.mean_microbatch, 3),
        **asdict(counters),
        "busy_fraction": ",".join(f"{b:.3f}" for b in busy),
        "rank_stats": stats,
        "wall_s": _round(wall, 4),
        "partitions_free": setup.pool.all_free if setup.pool else None,
        "stage_computations": {k: sum(s.get(k, 0) for s in stats)
                               for k in ("computed", "skipped", "aborted")},
        "label": cfg.label,
    }


def _ms(seconds) -> str:
    return "n/a" if seconds is None else f"{seconds * 1000:.1f} ms"


def summary_line(r: dict) -> str:
    line = (f"pipeinfer: {r['strategy']} on {r['n_ranks']} rank(s): prompt {r['n_prompt']} tokens "
            f"at {r['prefill_tps'] or 0:.1f} t/s; generated {r['n_generated']} tokens at "
            f"{r['speed_tps'] or 0:.2f} t/s; TTFT {_ms(r['ttft_s'])}; ITL {_ms(r['itl_s'])}")
    if r["accept_rate"] is not None:
        line += f"; acceptance {r['accept_rate']:.2f}"
    return line
