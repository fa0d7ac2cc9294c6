"""What the failover tests (test_front.py, test_front_watch.py) share: four prompts, a greedy
completion, a streamed one on a thread of its own, and four streams under way while a rank
of the front's job is killed (each of them must end as the undisturbed answer)."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import httpx

PROMPTS = ["def quicksort(arr):", "The capital of France is", "import numpy as np\n",
           "Once upon a time,"]
N_TOKENS = 64
KILL_AFTER = 12     # chunks every stream has when a rank is killed


def complete(url: str, prompt: str, **fields) -> str:
    body = {"prompt": prompt, "max_tokens": N_TOKENS, "temperature": 0, **fields}
    r = httpx.post(url + "/v1/completions", json=body, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"]


class Stream(threading.Thread):
    """One streamed completion on a thread: its chunks' text, and any error object."""

    def __init__(self, url: str, prompt: str, **fields):
        super().__init__(daemon=True)
        self.url, self.chunks, self.error, self.done = url, [], None, False
        self.body = {"prompt": prompt, "max_tokens": N_TOKENS, "temperature": 0,
                     "stream": True, **fields}

    def run(self) -> None:
        try:
            with httpx.stream("POST", self.url + "/v1/completions", json=self.body,
                              timeout=300) as r:
                for line in r.iter_lines():
                    if line == "data: [DONE]":
                        self.done = True
                    elif line.startswith("data: "):
                        obj = json.loads(line[6:])
                        if "error" in obj:
                            self.error = obj
                        else:
                            self.chunks.append(obj["choices"][0]["text"])
        except Exception as err:  # noqa: BLE001 (checked by the test)
            self.error = repr(err)

    @property
    def text(self) -> str:
        return "".join(self.chunks)


def streams_going(front, **fields) -> list[Stream]:
    """Four concurrent streams, once each has KILL_AFTER chunks."""
    streams = [Stream(front.url, p, **fields) for p in PROMPTS]
    for s in streams:
        s.start()
    deadline = time.monotonic() + 120
    while any(len(s.chunks) < KILL_AFTER and s.is_alive() for s in streams):
        assert time.monotonic() < deadline, "the streams did not get going"
        time.sleep(0.01)
    return streams

def kill_mid_stream(front, rank: int, **fields) -> tuple[list[Stream], dict]:
    """Four concurrent streams; once each has KILL_AFTER chunks, SIGKILL `rank` of the job;
    the streams' ends and /health while the job was being replaced."""
    before = front.wait_ready()
    streams = streams_going(front, **fields)
    pid = next(r["pid"] for r in before["ranks"] if r["rank"] == rank)
    os.kill(pid, signal.SIGKILL)
    statuses = set()
    while True:   # until a new job takes requests
        r = front.health()
        statuses.add((r.status_code, r.json().get("status")))
        if r.status_code == 200 and r.json()["job"] > before["job"]:
            break
        time.sleep(0.05)
    for s in streams:
        s.join(240)
    return streams, {"statuses": statuses, "before": before}
