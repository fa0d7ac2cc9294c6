"""Issue 34, the lookahead's cost where pipeinfer drafts: the head's Drafter as a job at 8
nodes loads it (the compact 0.5B's 32768-token copy, fed embeddings), 1 thread, drafting the
bench_peers coding prompt's continuation in jobs of one token each (a stage idles after every
step at 8 nodes), lookahead 0 and 3 alternating, K times. Prints seconds per drafted token,
decodes and their batch sizes (needs lookahead.patch applied). Run it under one node's quota:
    python experiments/cluster.py --nodes 1 --cpu 0.25 --period-us 10000 -- \
        .venv/bin/python experiments/reference/lookahead-2026-11-27/drafter_cost.py"""
import collections
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path[:0] = [str(ROOT / "experiments"), str(ROOT)]
from bench_peers import CODE_PROMPT, render_prompt  # noqa: E402
from pipeinfer.engine.files.draft_files import draft_file  # noqa: E402
from pipeinfer.engine.drafting.drafter import Drafter, DraftParams  # noqa: E402
from pipeinfer.model.draft_vocab_stage import DraftVocab, ReducedStage  # noqa: E402
from pipeinfer.model.embedding import Embedder  # noqa: E402
from pipeinfer.model.models import resolve_model  # noqa: E402
from pipeinfer.model.stage import Stage, StageConfig  # noqa: E402
from pipeinfer.model.tokenizer import Tokenizer  # noqa: E402

N, K = 128, int(sys.argv[1]) if len(sys.argv) > 1 else 3


class Counted:
    def __init__(self, stage):
        self.stage, self.batches = stage, []

    def decode(self, positions, *args, **kw):
        self.batches.append(len(positions))
        return self.stage.decode(positions, *args, **kw)

    def __getattr__(self, name):
        return getattr(self.stage, name)


tok = Tokenizer(resolve_model("qwen-coder-1.5b"))
prompt = tok.tokenize(render_prompt("qwen-coder-1.5b", CODE_PROMPT))
draft = draft_file("qwen-coder-0.5b", compact=True)
reduced = draft.head_file(32768)
vocab = DraftVocab.of(reduced, tok.n_vocab)
tok.close()
config = StageConfig(n_ctx=1024, n_batch=512, n_seq_max=1, n_threads=1, max_outputs=64)
stage = Stage(reduced, config, final=True, label="draft")
embed = Embedder(draft.path, draft.header)
texts = {}
for rep in range(K):
    for lookahead in (0, 3):
        counted = Counted(ReducedStage(stage, embed, vocab))
        drafter = Drafter(counted, 512, vocab)
        drafter.reset()
        drafter.sync(prompt)
        counted.batches.clear()
        context = list(prompt)
        t0 = time.perf_counter()
        while len(context) < len(prompt) + N:
            branches, _ = drafter.draft(context, DraftParams(max_tokens=3, lookahead=lookahead),
                                        cutoff=0.0, should_stop=lambda: True)
            context += branches[0]
        took = time.perf_counter() - t0
        texts.setdefault(lookahead, context)
        sizes = collections.Counter(counted.batches)
        print(f"rep {rep} lookahead {lookahead}: {took / N * 1000:.1f} ms a token, "
              f"{len(counted.batches)} decodes, batch sizes {dict(sorted(sizes.items()))}, "
              f"same text as lookahead 0: {context == texts[0]}", flush=True)
stage.close()
