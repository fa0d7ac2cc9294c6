"""`pipeinfer serve` without models: the request checks (api.py), stop strings, and the app
and the head's request loop over real HTTP with a scripted head (no MPI, no llama.cpp), for
what a real job cannot show on demand: a rank failing mid-request (503 naming it, every
waiting request too, the server refusing the rest), a full queue, a client leaving early.
The real server under mpiexec is tests/test_serve.py."""

from __future__ import annotations

import json
import threading
import time
from types import SimpleNamespace

import httpx
import pytest

from pipeinfer.engine.mpi_transport import RankFailed
from pipeinfer.metrics import Counters
from pipeinfer.model.sampling import SamplingParams
from pipeinfer.schedule.generation import Request
from pipeinfer.serve import api
from pipeinfer.serve.api import ApiError
from pipeinfer.serve.app import Service, build_app, ready
from pipeinfer.serve.bridge import Bridge, State
from pipeinfer.serve.http_thread import HttpThread
from pipeinfer.serve.loop import serve_requests
from pipeinfer.serve.metrics import ServeMetrics
from pipeinfer.serve.stop_text import StopText

DEFAULTS = SamplingParams()


# --- request checks ------------------------------------------------------------------------
def test_completion_fields_are_checked():
    ask = api.parse_completion({"prompt": "hi", "max_tokens": 5, "temperature": 0,
                                "stop": "\n", "seed": 3, "stream": True}, DEFAULTS)
    assert (ask.prompt, ask.max_tokens, ask.stop, ask.stream) == ("hi", 5, ("\n",), True)
    assert ask.sampling.temp == 0.0 and ask.sampling.seed == 3
    assert api.parse_completion({"prompt": ["one"]}, DEFAULTS).prompt == "one"
    bad = [{}, {"prompt": ""}, {"prompt": 3}, {"prompt": ["a", "b"]},
           {"prompt": "x", "max_tokens": 0}, {"prompt": "x", "max_tokens": "5"},
           {"prompt": "x", "max_tokens": True}, {"prompt": "x", "temperature": "hot"},
           {"prompt": "x", "temperature": 3}, {"prompt": "x", "n": 2},
           {"prompt": "x", "stop": [1]}, {"prompt": "x", "stop": ["a"] * 5},
           {"prompt": "x", "stream": "yes"}, {"prompt": "x", "top_p": 0},
           {"prompt": "x", "top_k": -1}, {"prompt": "x", "model": 7}]
    for body in bad:
        with pytest.raises(ApiError) as err:
            api.parse_completion(body, DEFAULTS)
        assert err.value.status == 400, body
        assert err.value.body()["error"]["type"] == "invalid_request_error"


def test_chat_messages_are_checked():
    ask = api.parse_chat({"messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "hi "}, {"type": "text",
                                                                       "text": "there"}]}],
        "max_completion_tokens": 7}, DEFAULTS)
    assert ask.messages == (("system", "Be brief."), ("user", "hi there"))
    assert ask.max_tokens == 7 and ask.chat
    for body in [{}, {"messages": []}, {"messages": "hi"}, {"messages": [{"role": "user"}]},
                 {"messages": [{"role": "wizard", "content": "x"}]},
                 {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}]:
        with pytest.raises(ApiError) as err:
            api.parse_chat(body, DEFAULTS)
        assert err.value.status == 400, body


def test_bodies_models_and_context():
    with pytest.raises(ApiError) as err:
        api.parse_body(b"{not json")
    assert err.value.status == 400
    with pytest.raises(ApiError):
        api.parse_body(b"[1, 2]")
    with pytest.raises(ApiError) as err:
        api.parse_body(b" " * (api.MAX_BODY + 1))
    assert err.value.status == 413
    api.check_model(None, "m")
    api.check_model("m", "m")
    with pytest.raises(ApiError) as err:
        api.check_model("other", "m")
    assert err.value.status == 404 and err.value.body()["error"]["code"] == 404
    assert api.n_predict(10, None, 64) == 54 and api.n_predict(10, 54, 64) == 54
    for n_prompt, max_tokens in ((64, None), (80, 1), (10, 55)):
        with pytest.raises(ApiError) as err:
            api.n_predict(n_prompt, max_tokens, 64)
        assert err.value.kind == "exceed_context_size_error"


def test_stop_strings_are_cut_and_never_sent_in_part():
    stops = StopText(["END", "\n\n"])
    sent = [stops.push(p) for p in ["Hello E", "N", "x wor", "ld\n", "\nmore"]]
    assert sent == ["Hello ", "", "ENx wor", "ld", ""] and stops.stopped
    assert stops.text == "Hello ENx world" and stops.finish() == ""
    stops = StopText(["END"])
    assert stops.push("abcE") == "abc" and stops.finish() == "E" and not stops.stopped
    assert StopText([]).push("x") == "x"


# --- the app and the loop with a scripted head ------------------------------------------------
class FakeTokenizer:
    def tokenize(self, text: str) -> list[int]:
        return [1] + [ord(c) for c in text]

    def apply_chat_template(self, messages) -> str:
        return "".join(f"<{role}>{content}" for role, content in messages) + "<assistant>"

    def piece(self, token: int) -> bytes:
        return chr(token).encode()


class FakeHead:
    """Generates "abcd..." one letter per `delay`; fails (a rank) at token `fail_at`."""

    def __init__(self, delay=0.01, fail_at=None):
        self.delay, self.fail_at = delay, fail_at
        self.tokenizer = FakeTokenizer()
        self.setup = SimpleNamespace(pipeline=SimpleNamespace(busy_s=0.0))
        self.gen = None
        self.generations: list[tuple[int, str]] = []   # (tokens given, stop reason)

    def request(self, prompt, n_predict, ignore_eos=False):
        return Request(tuple(prompt), n_predict, 64, ignore_eos)

    def stream(self, request, sampling):
        self.gen = gen = SimpleNamespace(counters=Counters(n_drafted=4, n_accepted=3),
                                         stop_reason="")
        given = 0
        try:
            for i in range(request.n_predict):
                if i == self.fail_at:
                    raise RankFailed(2, "llama_decode failed", "node2")
                time.sleep(self.delay)
                given += 1
                yield ord("a") + i % 26
            gen.stop_reason = "length"
        except GeneratorExit:
            gen.stop_reason = "cancelled"
        finally:
            self.generations.append((given, gen.stop_reason))

    def check_ranks(self):
        pass


@pytest.fixture
def server():
    """Start the app on a free port with a FakeHead; yields (base url, head, service)."""
    started = []

    def start(head, queue=4, api_key=None):
        service = Service(Bridge(queue), ServeMetrics(), "fake", 64, DEFAULTS, api_key)
        http = HttpThread(build_app(service), "127.0.0.1", 0)
        ready(service, head)
        errors = []

        def loop():
            try:
                serve_requests(head, service.bridge, service.metrics, lambda: not stop.is_set())
            except Exception as err:  # noqa: BLE001
                errors.append(err)

        stop = threading.Event()
        thread = threading.Thread(target=loop, daemon=True)
        thread.start()
        started.append((http, stop, thread))
        return f"http://127.0.0.1:{http.port}", service, errors

    yield start
    for http, stop, thread in started:
        stop.set()
        thread.join(5)
        http.stop()


def test_answers_stream_and_stop(server):
    url, service, _ = server(FakeHead())
    r = httpx.post(url + "/v1/completions", json={"prompt": "x", "max_tokens": 5})
    body = r.json()
    assert r.status_code == 200 and body["choices"][0]["text"] == "abcde"
    assert body["usage"] == {"prompt_tokens": 2, "completion_tokens": 5, "total_tokens": 7}
    assert body["choices"][0]["finish_reason"] == "length"
    r = httpx.post(url + "/v1/completions", json={"prompt": "x", "max_tokens": 9, "stop": "de"})
    assert r.json()["choices"][0]["text"] == "abc"
    assert r.json()["choices"][0]["finish_reason"] == "stop"
    with httpx.stream("POST", url + "/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "stream": True,
            "stream_options": {"include_usage": True}}) as r:
        lines = [line for line in r.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line[6:]) for line in lines[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == "abc" and chunks[-1]["usage"]["completion_tokens"] == 3
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    metrics = httpx.get(url + "/metrics").text
    assert 'pipeinfer_requests_total{endpoint="completions",status="200"} 2.0' in metrics
    assert "pipeinfer_completion_tokens_total 13.0" in metrics  # 5 + 5 to "de" + 3
    assert "pipeinfer_acceptance_ratio 0.75" in metrics


def test_errors_are_objects(server):
    url, service, _ = server(FakeHead(), api_key="sesame")
    key = {"Authorization": "Bearer sesame"}
    assert httpx.get(url + "/health").status_code == 200   # public
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "sesame"}):
        r = httpx.get(url + "/v1/models", headers=headers)
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    assert httpx.get(url + "/v1/models", headers=key).json()["data"][0]["id"] == "fake"
    r = httpx.post(url + "/v1/completions", content=b"{oops", headers=key)
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
    r = httpx.post(url + "/v1/completions", json={"prompt": "x", "model": "gpt-9"},
                   headers=key)
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    r = httpx.post(url + "/v1/completions", content=b"x" * (api.MAX_BODY + 10), headers=key)
    assert r.status_code == 413
    r = httpx.get(url + "/v1/nothing", headers=key)
    assert r.status_code == 404 and "no such endpoint" in r.json()["error"]["message"]
    r = httpx.get(url + "/v1/completions", headers=key)
    assert r.status_code == 405 and "error" in r.json()


def test_a_rank_failing_answers_503_naming_it(server):
    head = FakeHead(delay=0.05, fail_at=3)
    url, service, errors = server(head, queue=4)
    results = {}

    def ask(name, stream):
        body = {"prompt": "x", "max_tokens": 8, "stream": stream}
        if stream:
            with httpx.stream("POST", url + "/v1/completions", json=body, timeout=10) as r:
                results[name] = (r.status_code, [line for line in r.iter_lines() if line])
        else:
            r = httpx.post(url + "/v1/completions", json=body, timeout=10)
            results[name] = (r.status_code, r.json())

    threads = [threading.Thread(target=ask, args=("first", True))]
    threads[0].start()
    time.sleep(0.05)
    threads.append(threading.Thread(target=ask, args=("waiting", False)))
    threads[1].start()
    for t in threads:
        t.join(10)
    status, lines = results["first"]
    error = json.loads(lines[-1][6:])["error"]
    assert status == 200 and error["code"] == 503 and "rank 2 (node2)" in error["message"]
    status, body = results["waiting"]
    assert status == 503 and "rank 2 (node2): llama_decode failed" in body["error"]["message"]
    assert service.bridge.state is State.FAILED and isinstance(errors[0], RankFailed)
    r = httpx.get(url + "/health")
    assert r.status_code == 503 and "rank 2" in r.json()["error"]["message"]


def test_full_queue_and_a_client_leaving(server):
    head = FakeHead(delay=0.05)
    url, service, _ = server(head, queue=1)
    with httpx.stream("POST", url + "/v1/completions",
                      json={"prompt": "x", "max_tokens": 40, "stream": True}) as r:
        lines = r.iter_lines()
        assert next(lines).startswith("data: ")   # generating: the one running
        waiting = threading.Thread(target=httpx.post, args=(url + "/v1/completions",),
                                   kwargs={"json": {"prompt": "y", "max_tokens": 2},
                                           "timeout": 10})
        waiting.start()
        time.sleep(0.2)
        r2 = httpx.post(url + "/v1/completions", json={"prompt": "z", "max_tokens": 2})
        assert r2.status_code == 503 and "busy" in r2.json()["error"]["message"]
    # the client left after one token: the generation is cancelled, the waiting one runs
    waiting.join(10)
    deadline = time.monotonic() + 5
    while len(head.generations) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert head.generations[0][1] == "cancelled" and head.generations[0][0] < 40
    assert head.generations[1] == (2, "length")
    assert "pipeinfer_requests_cancelled_total 1.0" in httpx.get(url + "/metrics").text


def test_a_client_leaving_a_whole_answer_cancels_it(server):
    head = FakeHead(delay=0.05)
    url, service, _ = server(head)
    with pytest.raises(httpx.ReadTimeout):   # gone after 0.4 s of a 2 s answer
        httpx.post(url + "/v1/completions", json={"prompt": "x", "max_tokens": 40},
                   timeout=0.4)
    deadline = time.monotonic() + 5
    while not head.generations and time.monotonic() < deadline:
        time.sleep(0.02)
    assert head.generations[0][1] == "cancelled" and head.generations[0][0] < 30
