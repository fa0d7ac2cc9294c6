"""The console's data as the front keeps it (front/console.py), from pulses as the job sends
them: rates over the span the pulse covers (after an idle minute, not over the minute), the
table's tokens per request, and a watcher that falls behind gets the whole status again
rather than a backlog. (The browser's side: tests/test_console.py.)"""

from __future__ import annotations

import asyncio
import json

from pipeinfer.front.console import WATCHER_QUEUE, Console

TOTALS = {"drafted": 0, "accepted": 0, "runs_started": 0}


def pulse(at: float, span: float, busy: dict, runs: int, cpu: dict | None = None) -> dict:
    return {"at": at, "span": span, "busy_s": busy, "cpu_s": cpu or {0: at * 0.01, 1: 0.0},
            "rss_mb": {0: 200.0, 1: 150.0}, "in_flight": 1, "waiting": 0, "running": 1,
            "totals": dict(TOTALS, runs_started=runs)}


def test_rates_cover_the_pulse_span_not_the_idle_gap_before_it():
    console = Console("m")
    console.pulse(1, pulse(100.0, 1.0, {0: 5.0, 1: 4.0}, runs=50))   # (the baseline)
    for _ in range(20):   # the table's tokens of request 7 in the second that follows
        console.token(7, 0.04, first=False)
    console.token(8, 0.3, first=True)
    # an idle minute (no pulse: nothing moved), then a second of work
    console.pulse(1, pulse(161.0, 1.0, {0: 5.5, 1: 4.25}, runs=70))
    sample = console.samples[-1]
    assert sample["busy"] == {0: 0.5, 1: 0.25}
    assert sample["rates"]["runs_started"] == 20.0
    assert sample["requests"] == {7: 20.0, 8: 1.0} and sample["tokens_per_s"] == 21.0
    assert sample["cpu"][0] == 0.01   # (CPU: over the whole gap, idle polling included)
    assert sample["ttft"] == [0.3] and sum(sample["itl"]) == 20
    console.pulse(1, pulse(162.0, 1.0, {0: 5.5, 1: 4.25}, runs=70))
    assert console.samples[-1]["requests"] == {} and console.samples[-1]["busy"][0] == 0.0


def test_a_new_jobs_first_pulse_is_a_baseline():
    console = Console("m")
    console.pulse(1, pulse(10.0, 1.0, {0: 1.0}, runs=5))
    console.pulse(1, pulse(11.0, 1.0, {0: 1.5}, runs=9))
    console.pulse(2, pulse(50.0, 1.0, {0: 0.2}, runs=1))   # (job 2's counters start over)
    assert len(console.samples) == 1 and console.samples[0]["job"] == 1


def test_a_watcher_that_falls_behind_gets_the_status_again():
    async def run():
        console = Console("m")
        events = console.events()
        first = await events.__anext__()
        assert first.startswith("event: status\n")
        for n in range(WATCHER_QUEUE + 5):   # more than its queue holds, unread
            console.record("host_left", {"host": f"h{n}", "why": "gone", "ranks": 2})
        got = await events.__anext__()   # (its queue overflowed at the 65th: the status)
        assert got.startswith("event: status\n")
        status = json.loads(got.split("data: ", 1)[1])
        assert len(status["history"]) == WATCHER_QUEUE + 1
        for n in range(WATCHER_QUEUE + 1, WATCHER_QUEUE + 5):   # then the events after it
            assert f'"host":"h{n}"' in await events.__anext__()
        await events.aclose()
        assert not console.watchers
    asyncio.run(run())
