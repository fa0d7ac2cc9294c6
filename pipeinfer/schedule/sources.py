"""Which drafts to take under `--draft-source both`: the text's (n-gram lookup) or the draft
model's, by what each has been bringing.

An n-gram draft costs nothing on the head, but where the output does not repeat earlier text
its matches guess badly (on new code, far fewer of its tokens are accepted than of the
model's), and every job it answers is one the model does not. So the acceptance of each source is
followed (an exponential average over its drafted tokens, as speculative runs leave the
pipeline), and lookups are tried while the n-gram drafts are accepted at least about as often
as the model's (`MARGIN` below it). Otherwise the model drafts, and one job in `PROBE` still
tries the lookup so its record stays current (text that starts repeating is noticed); every
n-gram run that leaves while they are still worse doubles that interval (up to `MAX_PROBE`),
and it is back at `PROBE` once they are preferred again: on new code a probe is a pipeline slot
the model's draft would have used well.
"""

from __future__ import annotations

MARGIN = 0.1     # n-gram drafts are preferred down to this much under the model's acceptance
PROBE = 8        # while they are not, every PROBE-th job still tries the lookup ...
MAX_PROBE = 64   # ... an interval doubled by every n-gram run that did not change that
WEIGHT = 1 / 32  # weight of one drafted token in the running acceptance of its source


class SourceChoice:
    def __init__(self, margin: float = MARGIN, probe: int = PROBE, max_probe: int = MAX_PROBE):
        self.margin, self.probe, self.max_probe = margin, probe, max_probe
        self.rate: dict[str, float | None] = {"ngram": None, "model": None}
        self.interval = probe    # jobs between probes while the model is preferred
        self.since_probe = 0

    def observe(self, origin: str, guessed: int, accepted: int) -> None:
        """A speculative run of `origin` left the pipeline with `accepted` of `guessed`."""
        if guessed <= 0 or origin not in self.rate:
            return
        share = accepted / guessed
        old = self.rate[origin]
        w = min(1.0, guessed * WEIGHT)
        self.rate[origin] = share if old is None else old + w * (share - old)
        if origin == "ngram":
            self.interval = self.probe if self.prefers_ngram else \
                min(2 * self.interval, self.max_probe)

    @property
    def prefers_ngram(self) -> bool:
        ngram, model = self.rate["ngram"], self.rate["model"]
        return ngram is None or model is None or ngram >= model - self.margin

    def use_ngram(self) -> bool:
        """Whether the next draft job may be answered by a lookup."""
        if self.prefers_ngram:
            return True
        self.since_probe += 1
        if self.since_probe < self.interval:
            return False
        self.since_probe = 0
        return True
