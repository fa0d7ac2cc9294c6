"""What llama.cpp's programs print, read back: speed, time to first token, inter-token latency,
token counts and (llama-speculative) drafted and accepted tokens. Each parser takes the
program's stderr (where llama.cpp logs) and returns a dict with the keys bench_peers.py writes,
or raises PeerOutputError naming what is missing, so a changed format fails loudly.

llama-completion (common_perf_print):
    llama_perf_context_print: prompt eval time =   1234.56 ms /   107 tokens (...)
    llama_perf_context_print:        eval time =  20000.00 ms /   127 runs   (  157.48 ms per
        token,     6.35 tokens per second)
The first generated token comes from the prompt's evaluation, the other n-1 from eval runs: TTFT
is the prompt's evaluation time plus one sampling, speed = eval's tokens per second.

llama-speculative:
    encoded  107 tokens in    1.234 seconds, speed:   86.7 t/s
    decoded  131 tokens in   20.123 seconds, speed:    6.5 t/s
    n_draft   = 8
    n_predict = 131
    n_drafted = 120
    n_accept  = 100
TTFT is the prompt's encoding time (its first token is sampled from the prompt's logits).
"""

from __future__ import annotations

import re

NUMBER = r"([0-9]+(?:\.[0-9]+)?)"


class PeerOutputError(ValueError):
    pass


def _find(pattern: str, text: str, what: str, last: bool = True) -> tuple[str, ...]:
    found = re.findall(pattern, text)
    if not found:
        raise PeerOutputError(f"no {what} in the output (format changed?)")
    hit = found[-1] if last else found[0]
    return hit if isinstance(hit, tuple) else (hit,)


def parse_completion(stderr: str) -> dict:
    prompt_ms, n_prompt = _find(rf"prompt eval time\s*=\s*{NUMBER} ms\s*/\s*(\d+) tokens",
                                stderr, "prompt eval time")
    eval_ms, runs, ms_per_token, tps = _find(
        rf"\beval time\s*=\s*{NUMBER} ms\s*/\s*(\d+) runs\s*\(\s*{NUMBER} ms per token,\s*"
        rf"{NUMBER} tokens per second\)", stderr, "eval time")
    itl = float(ms_per_token) / 1000
    return {"n_prompt": int(n_prompt), "n_generated": int(runs) + 1,
            "speed_tps": float(tps), "itl_s": itl,
            "ttft_s": float(prompt_ms) / 1000, "prefill_tps":
            int(n_prompt) / (float(prompt_ms) / 1000) if float(prompt_ms) > 0 else None,
            "accept_rate": None, "n_drafted": 0, "n_accepted": 0}


def parse_speculative(stderr: str) -> dict:
    n_prompt, enc_s = _find(rf"encoded\s+(\d+) tokens in\s+{NUMBER} seconds", stderr,
                            "'encoded ... tokens' line")
    n_dec, dec_s, tps = _find(rf"decoded\s+(\d+) tokens in\s+{NUMBER} seconds, speed:\s+"
                              rf"{NUMBER} t/s", stderr, "'decoded ... tokens' line")
    n_drafted = int(_find(r"n_drafted\s*=\s*(\d+)", stderr, "n_drafted")[0])
    n_accept = int(_find(r"n_accept\s*=\s*(\d+)", stderr, "n_accept")[0])
    n_dec, dec_s = int(n_dec), float(dec_s)
    return {"n_prompt": int(n_prompt), "n_generated": n_dec, "speed_tps": float(tps),
            "itl_s": dec_s / n_dec if n_dec else None, "ttft_s": float(enc_s),
            "prefill_tps": int(n_prompt) / float(enc_s) if float(enc_s) > 0 else None,
            "accept_rate": n_accept / n_drafted if n_drafted else None,
            "n_drafted": n_drafted, "n_accepted": n_accept}
