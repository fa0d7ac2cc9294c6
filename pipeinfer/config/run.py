"""What `pipeinfer run` adds to a job: the generation it makes from its own prompt, and what
it reports where. (A served job has neither: each request brings its prompt and sampling.)"""

from __future__ import annotations

from dataclasses import dataclass

from ..model.sampling import SamplingParams


@dataclass(frozen=True)
class RequestConfig:
    """The job's own generation (`run`'s -p/-f, --chat, -n, --ignore-eos, sampling)."""
    prompt: str | None = None   # None: no prompt of the job's own (serve)
    chat: bool = False          # the prompt goes through the model's chat template
    n_predict: int = 128
    ignore_eos: bool = False
    sampling: SamplingParams = SamplingParams()


@dataclass(frozen=True)
class OutputConfig:
    """What a run reports, and where; `verbose` also decides how errors are described."""
    csv: str | None = None      # append a results row here
    json: bool = False          # one JSON object on stdout instead of streamed text
    label: str = ""             # free-form, in the CSV row
    trace: str | None = None    # the head's events and every rank's spans, as JSON lines
    verbose: int = 0
    summary: bool = True        # the summary line on stderr (-q: none)
