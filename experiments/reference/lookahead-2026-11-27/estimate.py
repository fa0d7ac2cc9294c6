"""Issue 34: how many tokens one decode of the head's draft could give if each draft step also
checked guesses from the text (prompt lookup inside the draft): the step decodes the newest
token plus up to G guessed tokens after it in one batch, and keeps the guesses the draft's own
argmax agrees with, in order. Off the pipeline: the draft's greedy text for the bench_peers
coding prompt (-n 128) is generated once; at each position the lookup (schedule/ngram.py
ngram_draft, n-gram sizes N_MIN..4) over the prompt and the text so far proposes G guesses;
accepted = the longest prefix equal to the draft's next tokens. Prints tokens per step and
the share of steps that tried a guess, per G and N_MIN. `python estimate.py`"""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path[:0] = [str(ROOT / "experiments"), str(ROOT),
                str(ROOT / "experiments" / "reference" / "scaling-2026-11-27")]
from bench_peers import CODE_PROMPT, render_prompt  # noqa: E402
from miss_bound import greedy_text  # noqa: E402
from pipeinfer.engine.files.draft_files import draft_file  # noqa: E402
from pipeinfer.model.models import resolve_model  # noqa: E402
from pipeinfer.model.tokenizer import Tokenizer  # noqa: E402
from pipeinfer.schedule.ngram import ngram_draft  # noqa: E402

N = 128
draft = draft_file("qwen-coder-0.5b", compact=True).path
tok = Tokenizer(resolve_model("qwen-coder-1.5b"))
prompt = tok.tokenize(render_prompt("qwen-coder-1.5b", CODE_PROMPT))
text = greedy_text(draft, prompt, N)
print(f"draft {draft.name}, its greedy text: {N} tokens")
print(repr(tok.detokenize(text))[:300])
tok.close()
for n_min in (1, 2):
    for g in (1, 3, 7):
        steps = tried = 0
        i = 0
        while i < N - 1:       # a step at i decodes text[i] (+ guesses), yields text[i+1] on
            context = prompt + text[:i + 1]
            guesses = ngram_draft(context, n_min, 4, min(g, N - 2 - i))
            ok = 0
            while ok < len(guesses) and guesses[ok] == text[i + 1 + ok]:
                ok += 1
            steps, tried, i = steps + 1, tried + bool(guesses), i + 1 + ok
        print(f"n-gram {n_min}..4, up to {g} guesses: {N - 1} tokens in {steps} steps, "
              f"{(N - 1) / steps:.2f} tokens a step, guesses tried in {tried} steps")
