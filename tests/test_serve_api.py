"""`pipeinfer serve` without models: the request checks (api/requests.py), stop strings, and
the whole serving path of a job launched by someone else (the front's app and request table
on a thread, the pipe to the job's end, the intake and the head's request loop) over real
HTTP, with scripted lanes in place of the model (no MPI, no llama.cpp), for what a real job
cannot show on demand: a rank failing mid-request (503 naming it, every waiting request too,
the server refusing the rest), a full queue, a client leaving early."""

from __future__ import annotations

import json
import multiprocessing
import threading
import time
from types import SimpleNamespace

import httpx
import pytest

from pipeinfer.engine.transport.mpi import RankFailed
from pipeinfer.schedule.counters import Counters, Timeline
from pipeinfer.model.sampling import SamplingParams
from pipeinfer.schedule.generation import Request
from pipeinfer.api import requests as api
from pipeinfer.api.requests import ApiError
from pipeinfer.front.in_job import InJobFront
from pipeinfer.config.job import JobConfig
from pipeinfer.config.serving import ServeConfig
from pipeinfer.serve.intake import open_intake
from pipeinfer.serve.link import FrontLink
from pipeinfer.serve.loop import serve_requests
from pipeinfer.serve.stop_text import StopText
from pipeinfer.api.tool_calls import ToolChoice

DEFAULTS = SamplingParams()


# --- request checks ------------------------------------------------------------------------
def test_completion_fields_are_checked():
    ask = api.parse_completion({"prompt": "hi", "max_tokens": 5, "temperature": 0,
                                "stop": "\n", "seed": 3, "stream": True}, DEFAULTS)
    assert (ask.prompts, ask.max_tokens, ask.stop, ask.stream) == (("hi",), 5, ("\n",), True)
    assert ask.sampling.temp == 0.0 and ask.sampling.seed == 3
    assert api.parse_completion({"prompt": ["one"]}, DEFAULTS).prompts == ("one",)
    assert api.parse_completion({"prompt": [5, 6]}, DEFAULTS).prompts == ((5, 6),)  # ids
    assert api.parse_completion({"prompt": [[5, 6]]}, DEFAULTS).prompts == ((5, 6),)
    several = api.parse_completion({"prompt": ["a", [5], "b"], "n": 2}, DEFAULTS)
    assert several.prompts == ("a", (5,), "b") and several.n_choices == 6
    bad = [{}, {"prompt": ""}, {"prompt": 3}, {"prompt": ["a", ""]}, {"prompt": []},
           {"prompt": [[1], [2.5]]}, {"prompt": [1, "a"]}, {"prompt": [True]}, {"prompt": [[]]},
           {"prompt": "x", "max_tokens": 0}, {"prompt": "x", "max_tokens": "5"},
           {"prompt": "x", "max_tokens": True}, {"prompt": "x", "temperature": "hot"},
           {"prompt": "x", "temperature": 3}, {"prompt": "x", "n": 0},
           {"prompt": "x", "stop": [1]}, {"prompt": "x", "stop": ["a"] * 5},
           {"prompt": "x", "stream": "yes"}, {"prompt": "x", "top_p": 0},
           {"prompt": "x", "top_k": -1}, {"prompt": "x", "model": 7}]
    for body in bad:
        with pytest.raises(ApiError) as err:
            api.parse_completion(body, DEFAULTS)
        assert err.value.status == 400, body
        assert err.value.body()["error"]["type"] == "invalid_request_error"


def test_sampling_and_logprob_fields():
    ask = api.parse_completion({"prompt": "x", "min_p": 0.1, "repeat_penalty": 1.3,
                                "repeat_last_n": -1, "frequency_penalty": 0.5,
                                "presence_penalty": -0.5, "logit_bias": {"7": -100, "9": 50,
                                                                         "11": False},
                                "logprobs": 2, "ignore_eos": True, "n_predict": 9}, DEFAULTS)
    s = ask.sampling
    assert (s.min_p, s.repeat_penalty, s.repeat_last_n) == (0.1, 1.3, -1)
    assert (s.frequency_penalty, s.presence_penalty) == (0.5, -0.5)
    assert s.logit_bias == ((7, -100.0), (9, 50.0), (11, float("-inf")))
    assert (ask.logprobs, ask.ignore_eos, ask.max_tokens) == (2, True, 9)
    chat = {"messages": [{"role": "user", "content": "hi"}]}
    assert api.parse_chat(chat, DEFAULTS).logprobs is None
    assert api.parse_chat(dict(chat, logprobs=True), DEFAULTS).logprobs == 0
    assert api.parse_chat(dict(chat, logprobs=True, top_logprobs=20), DEFAULTS).logprobs == 20
    harmless = [{"response_format": {"type": "text"}}, {"tools": []}, {"tool_choice": "none"},
                {"tool_choice": "auto"},
                {"typical_p": 1}, {"mirostat": 0}, {"user": "u"}, {"cache_prompt": True}]
    for extra in harmless:
        api.parse_chat(dict(chat, **extra), DEFAULTS)
    kwargs = {"chat_template_kwargs": {"enable_thinking": False}}
    assert api.parse_chat(dict(chat, **kwargs), DEFAULTS).template_kwargs == {
        "enable_thinking": False}


def test_fields_that_would_change_the_answer_are_refused_by_name():
    chat = {"messages": [{"role": "user", "content": "hi"}]}
    refused = [("top_logprobs", {"logprobs": True, "top_logprobs": 21}),
               ("top_logprobs", {"top_logprobs": 3}),
               ("logprobs", {"logprobs": "yes"}),
               ("response_format", {"response_format": {"type": "xml"}}),
               ("response_format", {"response_format": {"type": "json_schema",
                                                        "json_schema": {"name": "x"}}}),
               ("response_format", {"response_format": {"type": "json_object",
                                                        "schema": "yes"}}),
               ("grammar", {"grammar": 5}),
               ("grammar", {"response_format": {"type": "json_object"}, "grammar": "x"}),
               ("tools", {"tools": [{"type": "function", "function": {"name": ""}}]}),
               ("tools", {"tools": [{"type": "function", "function": {"name": "f",
                                                                        "parameters": 3}}]}),
               ("tools", {"tools": {"f": 1}}),
               ("tool_choice", {"tool_choice": "required"}),     # (no tools)
               ("tool_choice", {"tool_choice": {"type": "function",
                                                "function": {"name": "f"}}}),
               ("tool_choice", {"tools": [{"type": "function", "function": {"name": "f"}}],
                                "tool_choice": {"type": "function",
                                                "function": {"name": "g"}}}),
               ("tool_choice", {"tools": [{"type": "function", "function": {"name": "f"}}],
                                "tool_choice": "always"}),
               ("tool_choice", {"tools": [{"type": "function", "function": {"name": "f"}}],
                                "tool_choice": {"function": {"name": "f"}}}),
               ("parallel_tool_calls", {"parallel_tool_calls": "yes"}),
               ("function_call", {"function_call": {"name": "f"}}),
               ("mirostat", {"mirostat": 2}), ("typical_p", {"typical_p": 0.5}),
               ("n", {"n": -1}), ("frequency_penalty", {"frequency_penalty": 3}),
               ("repeat_penalty", {"repeat_penalty": 0}),
               ("repeat_last_n", {"repeat_last_n": -2}), ("min_p", {"min_p": 1.5}),
               ("logit_bias", {"logit_bias": {"hello": 1}}),
               ("logit_bias", {"logit_bias": {"5": 101}}), ("logit_bias", {"logit_bias": [1]}),
               ("messages", {"messages": [{"role": "assistant", "content": None, "tool_calls": [
                   {"id": "1", "type": "function",
                    "function": {"name": "f", "arguments": "{oops"}}]}]}),
               ("chat_template_kwargs", {"chat_template_kwargs": "x"})]
    for param, extra in refused:
        with pytest.raises(ApiError) as err:
            api.parse_chat(dict(chat, **extra), DEFAULTS)
        assert (err.value.status, err.value.param) == (400, param), extra
        assert param in err.value.message
    for param, extra in [("logprobs", {"logprobs": 21}), ("echo", {"echo": True}),
                         ("best_of", {"best_of": 3}), ("suffix", {"suffix": "}"}),
                         ("prompt", {"prompt": ["a", 5]})]:
        with pytest.raises(ApiError) as err:
            api.parse_completion(dict({"prompt": "x"}, **extra), DEFAULTS)
        assert (err.value.status, err.value.param) == (400, param), extra


def test_chat_messages_are_checked():
    ask = api.parse_chat({"messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "hi "}, {"type": "text",
                                                                       "text": "there"}]}],
        "max_completion_tokens": 7}, DEFAULTS)
    assert ask.messages == ({"role": "system", "content": "Be brief."},
                            {"role": "user", "content": "hi there"})
    assert ask.max_tokens == 7 and ask.chat
    calls = [{"id": "c1", "type": "function",
              "function": {"name": "f", "arguments": '{"x": 1}'}}]
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    ask = api.parse_chat({"messages": [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": None, "tool_calls": calls},
        {"role": "tool", "tool_call_id": "c1", "content": "42"}], "tools": tools}, DEFAULTS)
    assert ask.messages[1] == {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"x": 1}}}]}
    assert ask.messages[2] == {"role": "tool", "content": "42", "tool_call_id": "c1"}
    assert ask.tools == tuple(tools)
    assert api.parse_chat({"messages": [{"role": "user", "content": "go"}], "tools": tools,
                           "tool_choice": "none"}, DEFAULTS).tools == ()
    named = api.parse_chat({"messages": [{"role": "user", "content": "go"}], "tools": tools,
                            "tool_choice": {"type": "function", "function": {"name": "f"}},
                            "parallel_tool_calls": True}, DEFAULTS)
    assert named.tool_choice == ToolChoice(required=True, function="f", parallel=True)
    assert api.parse_chat({"messages": [{"role": "user", "content": "go"}], "tools": tools,
                           "tool_choice": "required"}, DEFAULTS).tool_choice == \
        ToolChoice(required=True)
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
    n_vocab = 0x110000

    def tokenize(self, text: str) -> list[int]:
        return [1] + [ord(c) for c in text]

    def chat_tokens(self, messages, **context) -> list[int]:
        return self.tokenize("".join(f"<{m['role']}>{m['content']}" for m in messages)
                             + "<assistant>")

    def piece(self, token: int, special: bool = False) -> bytes:
        return chr(token).encode()


class FakeHead:
    """The head's side the request loop uses besides its lanes."""

    def __init__(self):
        self.tokenizer = FakeTokenizer()
        self.setup = SimpleNamespace(pipeline=SimpleNamespace(busy_s=0.0, in_flight=0))

    def request(self, prompt, n_predict, ignore_eos=False, resumed=()):
        return Request(tuple(prompt), n_predict, 64, ignore_eos, resumed=tuple(resumed))

    def check_ranks(self):
        pass


class FakeLanes:
    """Stands in for engine.lanes.Lanes: up to `slots` generations at once, each giving
    "abcd..." one letter per `delay`; a rank fails when a generation reaches `fail_at`."""

    def __init__(self, slots=1, delay=0.01, fail_at=None):
        self.slots, self.delay, self.fail_at = slots, delay, fail_at
        self.active = []
        self.generations: list[tuple[int, str]] = []   # (tokens given, stop reason), ended
        self.most_active = 0

    refilling = False   # (no prompt cache here: nothing to refill)

    @property
    def n_free(self):
        return self.slots - len(self.active)

    def continues(self, prompt, cache, resumed):
        return False

    def stop_refills(self):
        pass

    def refill_idle(self):
        pass

    def start(self, request, sampling, owner, on_token, observe=None, cache_prompt=False,
              constraint=None, keep=0):
        assert self.n_free > 0
        lane = SimpleNamespace(owner=owner, on_token=on_token, n=request.n_predict, given=0,
                               next_at=time.monotonic() + self.delay, finished=False,
                               gen=SimpleNamespace(counters=Counters(n_drafted=4, n_accepted=3),
                                                   stop_reason="", request=request,
                                                   timeline=Timeline()))
        lane.slot, lane.strategy, lane.rooted_runs = len(self.active), "scripted", 0
        self.active.append(lane)
        self.most_active = max(self.most_active, len(self.active))
        return lane

    def cancel(self, lane):
        if not lane.finished:
            lane.finished, lane.gen.stop_reason = True, "cancelled"

    def turn(self):
        busy = False
        for lane in self.active:
            if lane.finished or time.monotonic() < lane.next_at:
                continue
            if lane.given == self.fail_at:
                raise RankFailed(2, "llama_decode failed", "node2")
            lane.on_token(ord("a") + lane.given % 26)
            lane.given, lane.next_at, busy = lane.given + 1, lane.next_at + self.delay, True
            if lane.given >= lane.n:
                lane.finished, lane.gen.stop_reason = True, "length"
        return busy

    def reap(self):
        done = [lane for lane in self.active if lane.finished]
        for lane in done:
            self.active.remove(lane)
            self.generations.append((lane.given, lane.gen.stop_reason))
        return done


@pytest.fixture
def server():
    """The front on a free port and the job's end of its pipe, the head's loop on a thread
    with `lanes`; yields (base url, the front, the bridge, the loop's errors)."""
    started = []

    def start(lanes, queue=4, api_key=None, cors=("*",)):
        head = FakeHead()
        front_end, job_end = multiprocessing.Pipe()
        served = ServeConfig("fake", "127.0.0.1", 0, queue, api_key, cors, lanes.slots,
                             defaults=DEFAULTS)
        front = InJobFront(served, front_end)
        link = FrontLink(job_end)
        bridge, stats = open_intake(link, served, JobConfig("fake", n_ctx=64, slots=lanes.slots),
                                    head)
        link.ready([(0, "here", 1)], lanes.slots, 64)
        errors, stop = [], threading.Event()

        def loop():
            try:
                serve_requests(head, bridge, stats, lambda: not stop.is_set(), lanes)
            except Exception as err:  # noqa: BLE001
                errors.append(err)

        thread = threading.Thread(target=loop, daemon=True)
        thread.start()
        started.append((front, link, stop, thread))
        return f"http://127.0.0.1:{front.port}", SimpleNamespace(front=front, bridge=bridge), \
            errors

    yield start
    for front, link, stop, thread in started:
        stop.set()
        thread.join(5)
        front.stop()
        link.close()


def test_answers_stream_and_stop(server):
    url, service, _ = server(FakeLanes())
    r = httpx.post(url + "/v1/completions", json={"prompt": "x", "max_tokens": 5})
    body = r.json()
    assert r.status_code == 200 and body["choices"][0]["text"] == "abcde"
    assert body["usage"] == {"prompt_tokens": 2, "completion_tokens": 5, "total_tokens": 7,
                             "prompt_tokens_details": {"cached_tokens": 0}}
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
    url, service, _ = server(FakeLanes(), api_key="sesame")
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
    assert r.status_code == 405 and r.json()["error"]["type"] == "invalid_request_error"
    r = httpx.post(url + "/v1/completions", json={"prompt": [5, 1 << 30]}, headers=key)
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"


def test_cors_origin_restricts_browsers(server):
    url, service, _ = server(FakeLanes(), api_key="sesame", cors=("http://ok.example",))
    ask = {"Access-Control-Request-Method": "POST",
           "Access-Control-Request-Headers": "authorization, content-type"}
    r = httpx.options(url + "/v1/completions", headers={"Origin": "http://ok.example", **ask})
    assert r.status_code == 200
    assert r.headers["access-control-allow-origin"] == "http://ok.example"
    r = httpx.options(url + "/v1/completions", headers={"Origin": "http://evil.example",
                                                         **ask})
    assert r.status_code == 400 and "access-control-allow-origin" not in r.headers
    r = httpx.get(url + "/v1/models", headers={"Origin": "http://ok.example",
                                               "Authorization": "Bearer sesame"})
    assert r.headers["access-control-allow-origin"] == "http://ok.example"


def test_a_rank_failing_answers_503_naming_it(server):
    head = FakeLanes(delay=0.05, fail_at=3)
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
    deadline = time.monotonic() + 5
    while not errors and time.monotonic() < deadline:   # (the loop's thread ends after it)
        time.sleep(0.02)
    assert service.bridge.failure and isinstance(errors[0], RankFailed)
    assert service.front.keeper.state == "failed"
    r = httpx.get(url + "/health")
    assert r.status_code == 503 and "rank 2" in r.json()["error"]["message"]


def test_full_queue_and_a_client_leaving(server):
    head = FakeLanes(delay=0.05)
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
    head = FakeLanes(delay=0.05)
    url, service, _ = server(head)
    with pytest.raises(httpx.ReadTimeout):   # gone after 0.4 s of a 2 s answer
        httpx.post(url + "/v1/completions", json={"prompt": "x", "max_tokens": 40},
                   timeout=0.4)
    deadline = time.monotonic() + 5
    while not head.generations and time.monotonic() < deadline:
        time.sleep(0.02)
    assert head.generations[0][1] == "cancelled" and head.generations[0][0] < 30


def test_parallel_requests_share_the_loop_and_the_rest_wait(server):
    """--parallel 2: two generations under way at once, a third waits for a free slot and
    then runs; every answer whole."""
    lanes = FakeLanes(slots=2, delay=0.03)
    url, service, _ = server(lanes, queue=4)
    answers = {}

    def ask(name, n):
        r = httpx.post(url + "/v1/completions", json={"prompt": name, "max_tokens": n},
                       timeout=10)
        answers[name] = r.json()["choices"][0]["text"]

    threads = [threading.Thread(target=ask, args=(name, n))
               for name, n in (("a", 10), ("b", 10), ("c", 3))]
    for t in threads:
        t.start()
        time.sleep(0.01)
    for t in threads:
        t.join(10)
    assert answers == {"a": "abcdefghij", "b": "abcdefghij", "c": "abc"}
    assert lanes.most_active == 2 and len(lanes.generations) == 3


def test_parallel_refused_for_pipespec():
    import subprocess
    import sys
    from pathlib import Path

    exe = Path(sys.executable).parent / "pipeinfer"
    res = subprocess.run([str(exe), "serve", "-m", "any.gguf", "-md", "d.gguf", "--strategy",
                          "pipespec", "--parallel", "2"], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "--parallel 2: strategy pipespec generates one request at a time" in res.stderr


def test_busy_strategy_needs_a_draft_model():
    import subprocess
    import sys
    from pathlib import Path

    exe = Path(sys.executable).parent / "pipeinfer"
    res = subprocess.run([str(exe), "serve", "-m", "any.gguf", "--strategy", "iterative",
                          "--parallel", "2", "--busy-strategy", "speculative"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "--busy-strategy speculative needs a draft model" in res.stderr


def test_parallel_defaults_to_four_where_requests_can_share_the_pipeline():
    from pipeinfer.cli.serve import _parallel

    assert _parallel(None, "pipeinfer") == 4 and _parallel(None, "iterative") == 4
    assert _parallel(None, "pipespec") == 1        # one request at a time
    assert _parallel(2, "pipeinfer") == 2 and _parallel(1, "pipespec") == 1


def test_busy_strategy_resolution():
    from pipeinfer.strategies import ADAPTIVE
    from pipeinfer.cli.serve import _busy

    assert _busy("auto", "pipeinfer", 4) == ADAPTIVE.name   # drafts ride in own runs when shared
    assert _busy("speculative", "pipeinfer", 4) == "speculative"
    assert _busy("auto", "iterative", 4) is None            # nothing to draft: as --strategy
    assert _busy("auto", "pipeinfer", 1) is None            # one at a time: never busy
    assert _busy("same", "pipeinfer", 4) is None
    assert _busy("iterative", "pipeinfer", 4) == "iterative"


def test_n_choices_and_several_prompts(server):
    """n = 2 and two prompts: one generation per choice, side by side; indices i*n + j;
    usage counts each prompt once; more choices than slots is a 400 naming the field."""
    url, service, _ = server(FakeLanes(slots=4, delay=0.01), queue=8)
    r = httpx.post(url + "/v1/completions", json={"prompt": ["x", "yy"], "n": 2,
                                                   "max_tokens": 3}).json()
    assert [(c["index"], c["text"]) for c in r["choices"]] == [(i, "abc") for i in range(4)]
    assert r["usage"] == {"prompt_tokens": 2 + 3, "completion_tokens": 12, "total_tokens": 17,
                          "prompt_tokens_details": {"cached_tokens": 0}}
    with httpx.stream("POST", url + "/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "hi"}], "n": 2, "max_tokens": 4,
            "stream": True, "stream_options": {"include_usage": True}}) as s:
        chunks = [json.loads(line[6:]) for line in s.iter_lines()
                  if line and line != "data: [DONE]"]
    texts, reasons = {0: "", 1: ""}, {}
    for chunk in chunks:
        for choice in chunk["choices"]:
            texts[choice["index"]] += choice["delta"].get("content", "")
            if choice["finish_reason"]:
                reasons[choice["index"]] = choice["finish_reason"]
    assert texts == {0: "abcd", 1: "abcd"} and reasons == {0: "length", 1: "length"}
    assert chunks[-1]["usage"]["completion_tokens"] == 8
    for body, param in (({"prompt": "x", "n": 5}, "n"),
                        ({"prompt": ["a", "b", "c"], "n": 2}, "prompt")):
        r = httpx.post(url + "/v1/completions", json=body)
        assert r.status_code == 400 and r.json()["error"]["param"] == param
