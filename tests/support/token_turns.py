"""A conversation asked of a test server with token-id prompts over HTTP, so that a turn's
prompt holds the previous answer's very tokens (the refill tests: a kept answer is reused
only if the next prompt repeats its tokens)."""

from __future__ import annotations

import httpx

from support.serving import AUTH

CODE = ("def merge_sort(items):\n    if len(items) <= 1:\n        return items\n"
        "    middle = len(items) // 2\n    left = merge_sort(items[:middle])\n")


def tokenize(server, text: str) -> list[int]:
    r = httpx.post(server.url + "/tokenize", headers=AUTH, json={"content": text}, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["tokens"]


def complete(server, prompt: list[int], cache: bool, n: int, timeout: float = 180) -> dict:
    """A greedy completion of exactly `n` tokens, with the top 3 logprobs of each."""
    r = httpx.post(server.url + "/v1/completions", headers=AUTH, timeout=timeout, json={
        "prompt": prompt, "max_tokens": n, "temperature": 0, "logprobs": 3,
        "ignore_eos": True, "cache_prompt": cache})
    assert r.status_code == 200, r.text
    return r.json()


def text_and_logprobs(body: dict) -> tuple[str, list]:
    choice = body["choices"][0]
    return choice["text"], choice["logprobs"]["top_logprobs"]


def cached(body: dict) -> int:
    return body["usage"]["prompt_tokens_details"]["cached_tokens"]


def next_turn(server, prompt: list[int], body: dict, ask: str) -> list[int]:
    """`prompt`, the answer `body` gave to it (its own tokens), and `ask`'s tokens."""
    text = body["choices"][0]["text"]
    answer = tokenize(server, text)
    pieces = body["choices"][0]["logprobs"]["tokens"]
    assert len(answer) == len(pieces), (answer, pieces)   # (re-tokenized as generated)
    return prompt + answer + tokenize(server, ask)
