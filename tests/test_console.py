"""The web console of `pipeinfer serve`, in a real browser (the distribution's Chromium,
driven by Playwright) against a real front and job (`serve --ranks 3`, SmolLM2, an API key):
the page asks for the key and shows nothing without it; the cluster view shows every rank
with the layers of the running split; a chat answer streams into the page and equals the
API's answer to the same greedy request; the live view moves while a request runs and is
still when idle; a worker killed while the page is open shows the service recovering, then
the new job and the failover with its recovery time, without a reload.

Screenshots of every view (1280x800 and a phone's 390x844) are kept in a directory printed
at the end (PIPEINFER_SCREENSHOTS names another, e.g. docs/images)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import threading
import time
from pathlib import Path

import gguf
import httpx
import pytest

from pipeinfer.front.page import ASSETS as CONSOLE_FILES
from support.serving import AUTH, KEY, Server, openai_client, serving

pytestmark = [pytest.mark.slow, pytest.mark.smollm2]

CHROMIUM = Path("/usr/bin/chromium")
WIDE, PHONE = {"width": 1280, "height": 800}, {"width": 390, "height": 844}
ASSETS = Path(__file__).resolve().parents[1] / "pipeinfer" / "front" / "assets"
ASSET_LIMIT = 300_000
PROMPT = "Write a Python function that returns the square of a number."
SYSTEM = "You are a helpful assistant who answers with code."


@pytest.fixture(scope="module")
def server(smollm2, tmp_path_factory):
    srv = Server(tmp_path_factory.mktemp("console"), 3, "-m", str(smollm2), "--api-key", KEY,
                 "--parallel", "2", "--max-restarts", "5")
    yield from serving(srv)


@pytest.fixture(scope="module")
def browser():
    sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright is not installed "
                                   "(bash install.sh test installs it)")
    if not CHROMIUM.exists():
        pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium; .ci/run does)")
    with sync_api.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        yield chromium
        chromium.close()


@pytest.fixture(scope="module")
def shots(tmp_path_factory):
    """Where the screenshots go; printed, and copied to PIPEINFER_SCREENSHOTS if set."""
    where = tmp_path_factory.mktemp("console-screenshots")
    yield where
    print(f"\nconsole screenshots: {where}")
    if os.environ.get("PIPEINFER_SCREENSHOTS"):
        target = Path(os.environ["PIPEINFER_SCREENSHOTS"])
        target.mkdir(parents=True, exist_ok=True)
        for png in where.glob("*.png"):
            shutil.copy2(png, target / png.name)


@pytest.fixture(scope="module")
def context(browser, server):
    """One browser profile for the module: the key, once given, is kept in it."""
    ctx = browser.new_context(viewport=WIDE)
    yield ctx
    ctx.close()


def _open(context, server, view: str):
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda err: errors.append(str(err)))
    page.goto(f"{server.url}/ui#{view}")
    page.errors = errors
    return page


def _shot(page, shots: Path, name: str) -> None:
    """The view at 1280x800 and at a phone's width (full pages)."""
    page.set_viewport_size(WIDE)
    page.screenshot(path=str(shots / f"console-{name}.png"), full_page=True)
    page.set_viewport_size(PHONE)
    page.wait_for_timeout(300)   # (the charts redraw at the new width)
    page.screenshot(path=str(shots / f"console-{name}-phone.png"), full_page=True)
    page.set_viewport_size(WIDE)


def _ready_split(stderr: str) -> list[tuple[int, int, int, int]]:
    """(rank, pid, first, last) of the job's ready line (the job's own log), the latest."""
    lines = [l for l in stderr.splitlines() if "ready: rank 0 pid" in l]
    found = re.findall(r"rank (\d+) pid (\d+) on \S+, layers \[(\d+),(\d+)\)", lines[-1])
    return [tuple(int(x) for x in f) for f in found]


def _n_layer(model: Path) -> int:
    """The model's layers, as its GGUF header says."""
    return int(gguf.GGUFReader(model).fields["llama.block_count"].parts[-1][0])


def _logged(server, what: str, times: int, timeout: float = 30) -> str:
    """The server's log once `what` is in it `times` times."""
    deadline = time.monotonic() + timeout
    while server.stderr.count(what) < times and time.monotonic() < deadline:
        time.sleep(0.2)
    return server.stderr


def test_the_page_asks_for_the_key_and_shows_nothing_without_it(server, context, shots):
    for path in ("/api/status", "/api/events"):
        assert httpx.get(server.url + path, timeout=10).status_code == 401
    bare = httpx.get(server.url + "/ui", timeout=10)
    assert bare.status_code == 200 and "rank 0" not in bare.text   # no data in the page
    assert httpx.get(server.url + "/", headers={"Accept": "text/html"},
                     timeout=10).headers["location"] == "/ui"
    page = _open(context, server, "cluster")
    page.wait_for_selector("#key-form:not([hidden])")
    assert page.locator("#cluster-text li").count() == 0
    page.get_by_role("textbox", name="API key").fill("not-the-key")
    page.keyboard.press("Enter")
    page.wait_for_function("document.getElementById('key-message').textContent"
                           ".includes('refused')")
    assert page.locator("#cluster-text li").count() == 0
    _shot(page, shots, "key")
    page.get_by_role("textbox", name="API key").fill(KEY)
    page.get_by_role("button", name="Use this key").click()
    page.wait_for_selector("#cluster-text li")
    assert page.locator("#key-form").is_hidden()
    page.reload()   # the key is kept in the browser
    page.wait_for_selector("#cluster-text li")
    assert page.locator("#key-form").is_hidden() and not page.errors
    page.close()


def test_the_cluster_view_shows_every_rank_with_its_layers(server, context, shots, smollm2):
    n_layer = _n_layer(smollm2)
    split = _ready_split(_logged(server, "ready: rank 0 pid", 1))
    page = _open(context, server, "cluster")
    page.wait_for_selector("#cluster-text li")
    text = page.locator("#cluster-text").inner_text()
    assert f"{n_layer} layers over 3 ranks" in text
    lines = page.locator("#cluster-text li").all_inner_texts()
    assert len(lines) == len(split) == 3
    for line, (rank, pid, first, last) in zip(lines, split):
        role = "head" if rank == 0 else "stage"
        assert line.startswith(f"rank {rank}: {role}, layers {first}\u2013{last - 1} "
                               f"({last - first} of {n_layer})"), line
        card = page.locator(f'.rank[data-rank="{rank}"]')
        assert f"pid {pid}" in card.inner_text()
        bar = card.locator(".layers span").evaluate("e => [e.style.left, e.style.width]")
        assert [float(v.rstrip("%")) for v in bar] == pytest.approx(
            [100 * first / n_layer, 100 * (last - first) / n_layer], abs=0.01)
        assert re.search(r"RSS \d+ MB of [\d.]+ GB", card.inner_text())
    _shot(page, shots, "cluster")
    page.close()


def _send(page, prompt: str, max_tokens: int) -> dict:
    """The prompt sent from the page with Ctrl+Enter; the answer's text as it grew, until
    it ended, and its statistics line."""
    page.get_by_label("Max tokens").fill(str(max_tokens))
    page.get_by_label("Message").fill(prompt)
    before = page.locator("article.assistant").count()
    page.get_by_label("Message").press("Control+Enter")
    answer = page.locator("article.assistant").nth(before)
    answer.wait_for()
    grown = []
    deadline = time.monotonic() + 120
    while answer.get_attribute("data-done") != "true" and time.monotonic() < deadline:
        raw = answer.get_attribute("data-raw") or ""
        if not grown or len(raw) != len(grown[-1]):
            grown.append(raw)
        time.sleep(0.02)
    return {"grown": grown, "raw": answer.get_attribute("data-raw"),
            "stats": answer.locator(".stats").inner_text(), "answer": answer}


def test_a_chat_answer_streams_into_the_page_and_equals_the_api(server, context, shots):
    page = _open(context, server, "chat")
    page.wait_for_selector("#cluster-text li", state="attached")
    page.get_by_text("System prompt and sampling").click()
    page.get_by_label("System prompt").fill(SYSTEM)
    page.get_by_label("Temperature").fill("0")
    got = _send(page, PROMPT, 96)
    client = openai_client(server)
    expected = client.chat.completions.create(
        model=client.models.list().data[0].id, temperature=0, max_tokens=96,
        messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": PROMPT}])
    assert got["raw"] == expected.choices[0].message.content
    partial = [g for g in got["grown"] if 0 < len(g) < len(got["raw"])]
    assert len(partial) >= 3, f"the answer did not stream in: {got['grown']}"
    assert all(got["raw"].startswith(g) for g in partial)
    assert re.search(r"\d+ tokens \u00b7 [\d.]+ t/s \u00b7 TTFT \d+ ms \u00b7 no drafts",
                     got["stats"]), got["stats"]
    if "```" in got["raw"]:   # code blocks are rendered as such
        assert got["answer"].locator("pre code").count() >= 1
    stopped = _stop_midway(page)
    assert "stopped" in stopped["stats"] and 0 < len(stopped["raw"]) and not page.errors
    _shot(page, shots, "chat")
    page.close()


def _stop_midway(page) -> dict:
    """A long answer stopped with the Stop button once some of it has come."""
    page.get_by_label("Max tokens").fill("1000")
    page.get_by_label("Message").fill("Now explain it in detail, step by step.")
    before = page.locator("article.assistant").count()
    page.get_by_role("button", name="Send").click()
    answer = page.locator("article.assistant").nth(before)
    page.wait_for_function("n => (document.querySelectorAll('article.assistant')[n]"
                           "?.dataset.raw || '').length > 20", arg=before)
    page.get_by_role("button", name="Stop").click()
    page.wait_for_function("n => document.querySelectorAll('article.assistant')[n]"
                           ".dataset.done === 'true'", arg=before)
    return {"raw": answer.get_attribute("data-raw"), "stats": answer.locator(".stats")
            .inner_text()}


def _picture(page) -> tuple[str, str]:
    """What the live view shows: its samples' count and its occupancy chart's pixels."""
    return (page.locator("#view-live").get_attribute("data-samples"),
            page.locator("#occupancy").evaluate("c => c.toDataURL()"))


def _still(page, seconds: float = 3.0) -> bool:
    first = _picture(page)
    time.sleep(seconds)
    return _picture(page) == first


class _Stream(threading.Thread):
    """A greedy streamed completion on a thread: its text, and whether it ended ([DONE])."""

    def __init__(self, url: str, max_tokens: int):
        super().__init__(daemon=True)
        self.url, self.text, self.done = url, "", False
        self.leave = threading.Event()   # set: the client goes away (its request is cancelled)
        self.body = {"prompt": "Once upon a time,", "max_tokens": max_tokens,
                     "temperature": 0, "ignore_eos": True, "stream": True}
        self.start()

    def run(self) -> None:
        with httpx.stream("POST", self.url + "/v1/completions", json=self.body, headers=AUTH,
                          timeout=300) as r:
            for line in r.iter_lines():
                if self.leave.is_set():
                    return
                if line == "data: [DONE]":
                    self.done = True
                elif line.startswith("data: "):
                    self.text += json.loads(line[6:])["choices"][0]["text"]


def test_the_live_view_moves_while_a_request_runs_and_is_still_when_idle(server, context,
                                                                         shots):
    page = _open(context, server, "live")
    page.wait_for_selector("#live-figures .figure")
    time.sleep(2.5)   # (the pulse after the last request, if one is still to come)
    assert _still(page), "the live view moved while the server was idle"
    samples = int(_picture(page)[0])
    running = _Stream(server.url, 600)
    pictures, figures = [], []
    while running.is_alive() and len(pictures) < 6:
        time.sleep(1.0)
        pictures.append(_picture(page))
        figures.append(page.locator("#live-figures").inner_text())
        if len(pictures) == 3:
            _shot(page, shots, "live")
    assert len({p[1] for p in pictures}) >= 3, "the occupancy chart did not move"
    assert int(pictures[-1][0]) >= samples + 4
    assert any("1 / 0\nrequests running / waiting" in f for f in figures), figures
    running.leave.set()
    running.join(300)
    time.sleep(2.5)
    assert _still(page), "the live view moved after the request ended"
    assert not page.errors
    page.close()


def test_a_killed_worker_shows_recovery_then_the_new_job_without_a_reload(server, context,
                                                                          shots):
    page = _open(context, server, "cluster")
    page.wait_for_selector("#cluster-text li")
    page.evaluate("""() => {
        window.notReloaded = true;
        window.states = [];
        new MutationObserver(() => window.states.push(
            document.getElementById('service').dataset.state))
            .observe(document.getElementById('service'), {attributes: true});
    }""")
    ranks = httpx.get(server.url + "/health", timeout=10).json()["ranks"]
    old_pids = {r["pid"] for r in ranks}
    running = _Stream(server.url, 200)
    page.wait_for_function("Number(document.getElementById('view-live').dataset.samples)"
                           " >= 2")   # (under way: the job's pulses come)
    os.kill(ranks[2]["pid"], signal.SIGKILL)
    page.wait_for_function("window.states.includes('recovering')", timeout=30_000)
    page.wait_for_function("document.getElementById('service').textContent"
                           ".startsWith('job 2: ok')", timeout=120_000)
    recovered = page.locator('#history li[data-name="recovered"]')
    recovered.wait_for()
    seconds = re.search(r"job 2 took requests ([\d.]+) s after the failure",
                        recovered.inner_text())
    assert seconds and float(seconds.group(1)) > 0, recovered.inner_text()
    assert "1 request(s) resumed" in recovered.inner_text()
    running.join(300)
    assert running.done and running.text   # (resumed on job 2 to its end)
    ended = page.locator('#history li[data-name="job_end"]').first.inner_text()
    assert "job 1 ended" in ended
    new = _ready_split(_logged(server, "ready: rank 0 pid", 2))
    shown = {int(p) for p in re.findall(r"pid (\d+)", page.locator("#cluster-hosts")
                                                     .inner_text())}
    assert shown == {pid for _, pid, _, _ in new} and not shown & old_pids
    assert page.evaluate("window.notReloaded === true") and not page.errors
    _shot(page, shots, "failover")
    page.close()


def test_the_console_is_small_and_its_files_need_no_key(server):
    size = sum(p.stat().st_size for p in ASSETS.iterdir())
    assert size < ASSET_LIMIT, f"the console's files weigh {size} bytes"
    for name in CONSOLE_FILES:
        assert httpx.get(f"{server.url}/ui/{name}", timeout=10).status_code == 200
    assert httpx.get(f"{server.url}/ui/nothing.js", timeout=10).status_code == 404
    assert httpx.get(server.url + "/api/status", headers=AUTH, timeout=10).status_code == 200


def test_without_a_key_the_page_opens_on_the_cluster_as_text(smollm2, browser, tmp_path):
    """No --api-key: the page holds the cluster as text, read without script."""
    srv = Server(tmp_path, 2, "-m", str(smollm2))
    try:
        srv.wait_ready()
        split = _ready_split(_logged(srv, "ready: rank 0 pid", 1))
        ctx = browser.new_context(viewport=WIDE, java_script_enabled=False)
        page = ctx.new_page()
        page.goto(srv.url + "/")   # (a browser at / goes to /ui)
        lines = page.locator("#cluster-text li").all_inner_texts()
        n_layer = _n_layer(smollm2)
        assert [line.split(",")[:2] for line in lines] == [
            [f"rank {rank}: {'head' if rank == 0 else 'stage'}", f" layers {first}\u2013"
             f"{last - 1} ({last - first} of {n_layer})"] for rank, _, first, last in split]
        assert f"{n_layer} layers over 2 ranks" in page.locator("#cluster-text").inner_text()
        ctx.close()
    finally:
        srv.kill()
