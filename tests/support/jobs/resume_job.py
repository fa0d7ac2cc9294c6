"""Under mpiexec: one job generates each plan entry's answer whole, then again resumed after
each given number of its tokens (as a job started after a failure would); rank 0 prints one
JSON line with every answer.

    mpiexec -n 3 python resume_job.py MODEL STRATEGY DRAFT|- PLAN_JSON

PLAN_JSON: [[prompt, n_predict, temp, seed, [k, ...]], ...]."""

from __future__ import annotations

import json
import sys

from pipeinfer.config.drafts import resolve_draft_source
from pipeinfer.config.job import JobConfig
from pipeinfer.job.roles import Job
from pipeinfer.model.sampling import SamplingParams
from pipeinfer.schedule.options import SpecOptions


def main() -> None:
    model, strategy, draft, plan = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
    draft = None if draft == "-" else draft
    source = resolve_draft_source(strategy, None, draft is not None)
    cfg = JobConfig(model=model, n_ctx=256, drafts=(draft,) if draft else (),
                    strategy=strategy, spec=SpecOptions(draft_source=source), full_logits=True)
    job = Job.start(cfg)
    if not job.is_head:
        sys.exit(job.serve())
    head, out = job.head, []
    for prompt, n_predict, temp, seed, cuts in plan:
        sampling = SamplingParams(temp=temp, seed=seed)
        tokens = head.tokenizer.tokenize(prompt)
        whole = head.generate(request=head.request(tokens, n_predict, True),
                              sampling=sampling).tokens
        whole = list(whole)
        resumed = {}
        for k in cuts:
            gen = head.generate(request=head.request(tokens, n_predict, True, whole[:k]),
                                sampling=sampling)
            resumed[k] = list(gen.tokens)
        out.append({"whole": whole, "resumed": resumed})
    head.shutdown()
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
