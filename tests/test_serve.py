"""`pipeinfer serve` for real, as users run it: the front launching a 3-rank job (SmolLM2,
itself as the draft, pipeinfer's strategy, the head drafting only, --parallel 4), started
once for the module, asked over HTTP with the `openai` client and httpx. Every greedy answer
equals single-node llama.cpp's for its prompt (tokens up to the first end-of-generation
token, with the weight layout the run uses: repacked for pipeinfer), request after request,
four at once, also after a client left mid-stream. Then every error case, and SIGTERM ending
every process. A job launched by mpiexec, serving from its rank 0, is
tests/test_serve_in_job.py."""

from __future__ import annotations

import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest

from support.serve_oracle import N_CTX, chat_tokens, expected
from support.serving import AUTH, KEY, Server, serving

pytestmark = [pytest.mark.slow, pytest.mark.smollm2]


@pytest.fixture(scope="module")
def server(smollm2, tmp_path_factory):
    srv = Server(tmp_path_factory.mktemp("serve"), 3, "-m", str(smollm2), "-md", str(smollm2),
                 "--strategy", "pipeinfer", "--layer-split", "0,0.5,0.5", "-c", str(N_CTX),
                 "--api-key", KEY, "--queue", "4", "--alias", "smollm2", "--parallel", "4",
                 "--no-cache-prompt")   # every answer is compared with a fresh evaluation
    yield from serving(srv)


def test_health_models_and_loading(server):
    assert all(code == 503 for code in server.early)
    health = httpx.get(server.url + "/health").json()
    assert health["status"] == "ok" and [r["rank"] for r in health["ranks"]] == [0, 1, 2]
    models = httpx.get(server.url + "/v1/models", headers=AUTH).json()
    assert [m["id"] for m in models["data"]] == ["smollm2"]


def test_completion_is_exact(server, client, smollm2, tokenizer):
    prompt = "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"
    answer = client.completions.create(model="smollm2", prompt=prompt, max_tokens=32,
                                       temperature=0)
    text, n, reason = expected(smollm2, tokenizer, tokenizer.tokenize(prompt), 32)
    assert answer.choices[0].text == text and answer.choices[0].finish_reason == reason
    assert answer.usage.completion_tokens == n
    assert answer.usage.prompt_tokens == len(tokenizer.tokenize(prompt))
    ids = tokenizer.tokenize(prompt)   # the same prompt as token ids (OpenAI's array form)
    by_ids = client.completions.create(model="smollm2", prompt=ids, max_tokens=32,
                                       temperature=0)
    assert by_ids.choices[0].text == text and by_ids.usage.prompt_tokens == len(ids)


def test_chat_is_exact(server, client, smollm2, tokenizer):
    messages = [{"role": "system", "content": "You are a concise assistant."},
                {"role": "user", "content": "Name three colours of the rainbow."}]
    answer = client.chat.completions.create(model="smollm2", messages=messages,
                                            max_tokens=40, temperature=0)
    prompt = chat_tokens(tokenizer, messages)
    text, n, reason = expected(smollm2, tokenizer, prompt, 40)
    assert answer.usage.prompt_tokens == len(prompt)   # the template's system message too
    assert answer.choices[0].message.content == text
    assert answer.choices[0].message.role == "assistant"
    assert (answer.choices[0].finish_reason, answer.usage.completion_tokens) == (reason, n)


def test_streaming_is_exact(server, client, smollm2, tokenizer):
    messages = [{"role": "user", "content": "Write a haiku about pipelines."}]
    stream = client.chat.completions.create(model="smollm2", messages=messages, max_tokens=30,
                                            temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    want, n, reason = expected(smollm2, tokenizer, chat_tokens(tokenizer, messages), 30)
    assert text == want and chunks[-1].usage.completion_tokens == n
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == reason
    prompt = "The capital of France is"
    pieces = list(client.completions.create(model="smollm2", prompt=prompt, max_tokens=12,
                                            temperature=0, stream=True))
    assert "".join(p.choices[0].text for p in pieces) == expected(
        smollm2, tokenizer, tokenizer.tokenize(prompt), 12)[0]


def test_sequential_requests_are_each_exact(server, smollm2, tokenizer):
    for prompt, n in [("Once upon a time", 8), ("import numpy as np\n", 24),
                      ("1, 2, 3, 4,", 16)]:
        r = httpx.post(server.url + "/v1/completions", headers=AUTH, timeout=120,
                       json={"prompt": prompt, "max_tokens": n, "temperature": 0})
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["text"] == expected(
            smollm2, tokenizer, tokenizer.tokenize(prompt), n)[0], prompt


def test_sampling_follows_the_seed(server):
    def ask(seed):
        r = httpx.post(server.url + "/v1/completions", headers=AUTH, timeout=120,
                       json={"prompt": "My favourite animal is", "max_tokens": 16,
                             "temperature": 0.9, "top_p": 0.95, "seed": seed})
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["text"]

    first = ask(7)
    assert ask(7) == first and len({first, ask(8), ask(9)}) > 1


def test_disconnect_mid_stream_then_exact(server, smollm2, tokenizer):
    body = {"prompt": "List the numbers from one to one hundred: one, two,", "max_tokens": 300,
            "temperature": 0, "stream": True}
    with httpx.stream("POST", server.url + "/v1/completions", headers=AUTH, json=body,
                      timeout=60) as r:
        lines = r.iter_lines()
        got = [next(lines) for _ in range(6)]
    assert any(line.startswith("data: ") for line in got)
    prompt = "The quick brown fox"
    r = httpx.post(server.url + "/v1/completions", headers=AUTH, timeout=120,
                   json={"prompt": prompt, "max_tokens": 20, "temperature": 0})
    assert r.json()["choices"][0]["text"] == expected(
        smollm2, tokenizer, tokenizer.tokenize(prompt), 20)[0]
    metrics = httpx.get(server.url + "/metrics", headers=AUTH).text
    assert "pipeinfer_requests_cancelled_total 1.0" in metrics


def test_concurrent_requests_are_each_exact(server, client, smollm2, tokenizer):
    """Four requests at once (chat, completion, both streamed and not) share the pipeline,
    and a fifth client leaves mid-stream meanwhile: every answer is exact."""
    asks = [("chat", "Name three colours of the rainbow.", 40, False),
            ("completion", "import numpy as np\n", 48, True),
            ("chat", "Write a haiku about pipelines.", 30, True),
            ("completion", "1, 2, 3, 4,", 40, False)]
    answers: dict[int, str] = {}

    def ask(i: int) -> None:
        kind, text, n, stream = asks[i]
        if kind == "chat":
            r = client.chat.completions.create(
                model="smollm2", messages=[{"role": "user", "content": text}], max_tokens=n,
                temperature=0, stream=stream)
            answers[i] = ("".join(c.choices[0].delta.content or "" for c in r if c.choices)
                          if stream else r.choices[0].message.content)
        else:
            r = client.completions.create(model="smollm2", prompt=text, max_tokens=n,
                                          temperature=0, stream=stream)
            answers[i] = ("".join(c.choices[0].text for c in r) if stream
                          else r.choices[0].text)

    def leave() -> None:
        body = {"prompt": "Count: one, two,", "max_tokens": 200, "temperature": 0,
                "stream": True}
        with httpx.stream("POST", server.url + "/v1/completions", headers=AUTH, json=body,
                          timeout=60) as r:
            lines = r.iter_lines()
            for _ in range(4):
                next(lines)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(asks))]
    threads.append(threading.Thread(target=leave))
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    for i, (kind, text, n, _) in enumerate(asks):
        tokens = (chat_tokens(tokenizer, [{"role": "user", "content": text}]) if kind == "chat"
                  else tokenizer.tokenize(text))
        assert answers.get(i) == expected(smollm2, tokenizer, tokens, n)[0], asks[i]
    under_way = [int(n) for n in re.findall(r"\((\d+) under way\)", server.stderr)]
    assert max(under_way) >= 3, "the requests did not overlap"
    # --busy-strategy auto: while others ran, requests verified their drafts in the runs of
    # their own next tokens (schedule/adaptive.py), exact all the same
    assert re.search(r"slot \d+, pipeinfer-adaptive \(", server.stderr)
    assert re.search(r"\d+ of its runs carried its drafts", server.stderr), "never shared"


def head_rss_kb(server) -> int:
    pid = re.search(r"rank 0 pid (\d+)", server.stderr).group(1)
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+)", status).group(1))


def test_soak_keeps_the_head_flat(server):
    """A few hundred short requests, four clients at a time, in bounded time: all answered,
    and the head's resident memory after them is where it was after the first fifty."""
    def batch(n_requests: int) -> None:
        def client(k: int) -> None:
            with httpx.Client(headers=AUTH, timeout=60) as http:
                for i in range(k, n_requests, 4):
                    r = http.post(server.url + "/v1/completions",
                                  json={"prompt": f"Item {i}:", "max_tokens": 3,
                                        "temperature": 0, "stream": i % 2 == 0})
                    assert r.status_code == 200, r.text
        threads = [threading.Thread(target=client, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(240)

    start = time.monotonic()
    batch(50)
    before = head_rss_kb(server)
    batch(250)
    growth_mb = (head_rss_kb(server) - before) / 1024
    assert time.monotonic() - start < 240
    assert growth_mb < 16, f"the head grew by {growth_mb:.1f} MB over 250 requests"


def test_errors(server):
    def post(path, headers=AUTH, **kw):
        r = httpx.post(server.url + path, headers=headers, timeout=30, **kw)
        error = r.json()["error"]
        assert set(error) >= {"message", "type", "code"} and error["code"] == r.status_code
        return r.status_code, error["message"]

    completions, chat = "/v1/completions", "/v1/chat/completions"
    assert post(completions, content=b'{"prompt": ')[0] == 400
    assert post(completions, json={"prompt": "x", "max_tokens": "ten"})[0] == 400
    assert post(completions, json={"prompt": "x", "temperature": [1]})[0] == 400
    assert post(completions, json={"prompt": "x", "max_tokens": 0})[0] == 400
    status, message = post(completions, json={"prompt": "x", "max_tokens": N_CTX + 1})
    assert status == 400 and "context" in message
    status, message = post(completions, json={"prompt": "hello " * N_CTX, "max_tokens": 4})
    assert status == 400 and "context" in message
    assert post(completions, json={"prompt": ""})[0] == 400
    status, message = post(completions, json={"prompt": [1, 10 ** 9]})
    assert status == 400 and "outside the vocabulary" in message
    assert post(chat, json={"messages": []})[0] == 400
    assert post(completions, json={"prompt": "x", "n": 5})[0] == 400   # > --parallel 4
    assert post(completions, json={"prompt": "x", "model": "gpt-4"})[0] == 404
    assert post(completions, content=b"x" * ((1 << 20) + 10))[0] == 413
    assert post(completions, headers={}, json={"prompt": "x"})[0] == 401
    assert post(completions, headers={"Authorization": "Bearer nope"},
                json={"prompt": "x"})[0] == 401


def test_metrics(server):
    text = httpx.get(server.url + "/metrics", headers=AUTH).text
    count = next(line for line in text.splitlines()
                 if line.startswith("pipeinfer_time_to_first_token_seconds_count"))
    assert float(count.split()[-1]) >= 5
    for name in ("pipeinfer_queue_depth", "pipeinfer_acceptance_ratio",
                 "pipeinfer_inter_token_latency_seconds_bucket", "pipeinfer_drafted_tokens"):
        assert name in text
    busy = dict(re.findall(r'pipeinfer_stage_busy_seconds\{rank="(\d)"\} (\S+)', text))
    assert float(busy["1"]) > 0 and float(busy["2"]) > 0   # the workers', by probe


def test_sigterm_ends_every_rank(server):
    """Last of the module: the server it shares goes."""
    server.proc.send_signal(signal.SIGTERM)
    try:
        server.proc.wait(30)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the front still runs 30 s after SIGTERM:\n{server.stderr}")
    deadline = time.monotonic() + 5
    while server.processes() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert server.processes() == []
    assert "Traceback" not in server.stderr, server.stderr


def test_serve_with_the_auto_split_is_exact(smollm2, tokenizer, tmp_path):
    """`serve --layer-split auto` under mpiexec: it calibrates (every rank), says the split it
    chose, and its greedy answers are still exactly llama.cpp's."""
    profile = tmp_path / "profile.json"
    srv = Server(tmp_path, 3, "-m", str(smollm2), "-md", str(smollm2), "--strategy",
                 "pipeinfer", "--layer-split", "auto", "--profile", str(profile), "-c",
                 str(N_CTX))
    try:
        srv.wait_ready(240)
        assert "--layer-split auto:" in srv.stderr and profile.exists(), srv.stderr
        prompt = "def is_prime(n):\n"
        r = httpx.post(srv.url + "/v1/completions", timeout=120,
                       json={"prompt": prompt, "max_tokens": 24, "temperature": 0})
        text, n, _ = expected(smollm2, tokenizer, tokenizer.tokenize(prompt), 24)
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == text
    finally:
        srv.kill()
