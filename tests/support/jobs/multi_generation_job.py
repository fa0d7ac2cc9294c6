"""Under mpiexec: one job, several generations one after another (what `pipeinfer serve` does
with its requests); rank 0 prints one JSON line with each generation's tokens.

    mpiexec -n 3 python multi_generation_job.py MODEL STRATEGY DRAFT|- PLAN_JSON

PLAN_JSON: [[prompt, n_predict, cancel_after], ...]; cancel_after > 0 leaves the generation
after that many tokens (the driver cancels it and drains its runs)."""

from __future__ import annotations

import json
import sys

from pipeinfer.config.drafts import resolve_draft_source
from pipeinfer.config.job import JobConfig
from pipeinfer.job.roles import Job
from pipeinfer.schedule.options import SpecOptions


def main() -> None:
    model, strategy, draft, plan = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
    draft = None if draft == "-" else draft
    source = resolve_draft_source(strategy, None, draft is not None)
    spec = SpecOptions(draft_source=source, draft_thread=True)
    cfg = JobConfig(model=model, n_ctx=256, drafts=(draft,) if draft else (),
                    strategy=strategy, spec=spec, full_logits=True)
    job = Job.start(cfg)
    if not job.is_head:
        sys.exit(job.serve())
    head, out = job.head, []
    for prompt, n_predict, cancel_after in plan:
        tokens = head.tokenizer.tokenize(prompt)
        stream = head.stream(head.request(tokens, n_predict, ignore_eos=True))
        got = []
        for token in stream:
            got.append(token)
            if cancel_after and len(got) >= cancel_after:
                break
        stream.close()
        out.append({"prompt_tokens": tokens, "tokens": got, "stop": head.gen.stop_reason,
                    "drafted": head.gen.counters.n_drafted,
                    "partitions_free": head.setup.pool is None or head.setup.pool.all_free})
    head.shutdown()
    print(json.dumps({"generations": out, "repack": cfg.repack_target}), flush=True)


if __name__ == "__main__":
    main()
