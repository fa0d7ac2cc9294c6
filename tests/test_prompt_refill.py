"""Refills, for real (engine/head/refill.py): `pipeinfer serve --ranks 3` with the exact
prompt cache and prompt chunks of 16 tokens, SmolLM2, iterative and pipeinfer, asked over
HTTP with token-id prompts (so that a turn's prompt holds the previous answer's very tokens).

While a slot is idle after a request, the answer's whole chunks are evaluated again as
prompt: the next turn of that conversation reuses them, and answers as a fresh evaluation
does. The next turn, asked while its refill is under way, takes the slot behind it and
reuses all of it; any other request cancels it (the slot keeps what came back). Every answer
is a fresh evaluation's. (The refill along the generation, `--refill-along`, is
test_refill_along.py's.)"""

from __future__ import annotations

import re
import threading
import time

import pytest

from support.serving import KEY, Server, serving
from support.token_turns import (CODE, cached, complete, next_turn, text_and_logprobs,
                                 tokenize)

pytestmark = pytest.mark.smollm2

CHUNK = 16
REFILLED = re.compile(r"slot (\d+): (\d+) of the (\d+) tokens refilled( \(a request came\))?")
FIRST_REFILL = re.compile(r"tokens refilled.*")


@pytest.fixture(scope="module", params=["iterative", "pipeinfer"])
def server(request, smollm2, tmp_path_factory):
    srv = Server(tmp_path_factory.mktemp(f"refill-{request.param}"), 3,
                 "-m", str(smollm2), "-md", str(smollm2), "--layer-split", "0,0.5,0.5",
                 "-c", "1024", "--prefill-chunk", str(CHUNK), "--api-key", KEY,
                 "--parallel", "2", "--strategy", request.param)
    yield from serving(srv)


def refills(server) -> list[tuple[int, int, bool]]:
    """(refilled, wanted, cut short by a request) of every refill so far, from the log."""
    return [(int(m[2]), int(m[3]), bool(m[4])) for m in REFILLED.finditer(server.stderr)]


def wait_for_refills(server, count: int, limit_s: float = 60) -> list:
    deadline = time.monotonic() + limit_s
    while len(done := refills(server)) < count:
        assert time.monotonic() < deadline, server.stderr[-3000:]
        time.sleep(0.05)
    return done


def test_an_idle_slot_refills_the_answer_and_the_next_turn_reuses_it(server):
    prompt = tokenize(server, CODE)
    before = len(refills(server))
    first = complete(server, prompt, cache=True, n=40)
    (done, wanted, cut), = wait_for_refills(server, before + 1)[before:]
    kept = len(prompt) + 40 - 1          # the answer's last token has no cell
    assert done == wanted > 0 and not cut
    assert wanted == kept // CHUNK * CHUNK - len(prompt) // CHUNK * CHUNK
    second_prompt = next_turn(server, prompt, first, "\n\ndef merge(left, right):\n")
    second = complete(server, second_prompt, cache=True, n=24)
    fresh = complete(server, second_prompt, cache=False, n=24)
    assert text_and_logprobs(second) == text_and_logprobs(fresh)
    assert cached(second) == kept // CHUNK * CHUNK > len(prompt) // CHUNK * CHUNK


def test_the_next_turn_during_its_refill_takes_the_slot_behind_it(server):
    """The next turn asked at once, while the answer before it is being refilled: the
    request takes the slot with the refill going on, reuses every refilled chunk, and
    answers as a fresh evaluation does. Whether it comes before the refill ends is a race
    the long answers make likely; each try is checked, and one of three must have come
    during the refill."""
    continued = []
    for n in (200, 300, 400):
        prompt = tokenize(server, f"# {n}\n" + CODE)
        mark = len(server.stderr)
        first = complete(server, prompt, cache=True, n=n)
        second_prompt = next_turn(server, prompt, first, "\n\ndef merge(left, right):\n")
        second = complete(server, second_prompt, cache=True, n=16)
        fresh = complete(server, second_prompt, cache=False, n=16)
        assert text_and_logprobs(second) == text_and_logprobs(fresh)
        kept = len(prompt) + n - 1
        assert cached(second) == kept // CHUNK * CHUNK
        log = server.stderr[mark:]
        continued.append("the request continues its refill" in log)
        if continued[-1]:   # (the first refill since: the first answer's, whole)
            assert FIRST_REFILL.search(log)[0].endswith("(a request continued it)"), log
            break
    assert any(continued), server.stderr[-3000:]


def test_another_request_during_a_refill_cancels_it(server):
    """A request for another conversation, asked while a long answer is being refilled:
    the refill gives way (the slot keeps what came back), the request answers as fresh,
    and so does the first conversation's next turn, from what its slot kept."""
    prompt = tokenize(server, "# 400\n" + CODE)
    other = tokenize(server, "# another one\n" + CODE)
    before = len(refills(server))
    first = complete(server, prompt, cache=True, n=400)
    assert complete(server, other, cache=True, n=16)["choices"][0]["text"] == \
        complete(server, other, cache=False, n=16)["choices"][0]["text"]
    done, wanted, cut = wait_for_refills(server, before + 1)[before]
    assert cut and done < wanted, refills(server)
    second_prompt = next_turn(server, prompt, first, "\n\ndef merge(left, right):\n")
    second = complete(server, second_prompt, cache=True, n=16)
    assert text_and_logprobs(second) == text_and_logprobs(
        complete(server, second_prompt, cache=False, n=16))
    assert cached(second) % CHUNK == 0


def test_no_refill_while_another_request_generates(server):
    """A short request ends while a long one still generates: its slot is refilled only once
    the long one is done (a refill's chunks would delay the long one's runs)."""
    long_prompt = tokenize(server, "class Queue:\n    def __init__(self):\n")
    short_prompt = tokenize(server, "# a short one\n" + CODE)
    mark = len(server.stderr)

    def ask(tokens: list[int], n: int) -> None:
        complete(server, tokens, cache=True, n=n)

    long_one = threading.Thread(target=ask, args=(long_prompt, 300))
    long_one.start()
    time.sleep(0.3)
    complete(server, short_prompt, cache=True, n=40)
    long_one.join(300)
    deadline = time.monotonic() + 60
    while "refilling" not in (log := server.stderr[mark:]).partition("done, 300 tokens")[2]:
        assert time.monotonic() < deadline, log   # (once the long one is done, they start)
        time.sleep(0.05)
    short_done = log.index("done, 40 tokens")
    long_done = log.index("done, 300 tokens")
    assert short_done < long_done, log
    assert "refilling" not in log[short_done:long_done], log
