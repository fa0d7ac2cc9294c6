"""Which hosts the front's next job runs on (front/hosts.py): a host that stops answering is
left out and comes back as soon as it answers; a host whose rank keeps failing while the host
answers is left out and kept out for QUARANTINE_S; failures that are not in a row, or on the
last host, leave nothing out. A clock and a probe stand in for time and the launcher."""

from __future__ import annotations

import asyncio

from pipeinfer.front.hosts import HOST_FAILURES, QUARANTINE_S, HostSet
from pipeinfer.front.launcher import Host

NODES = [Host("node0"), Host("node1"), Host("node2", slots=2)]


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def probe_with(answering: set[str]):
    async def probe(host: Host) -> bool:
        return host.name in answering
    return probe


def returning(hosts: HostSet, answering: set[str]) -> list[str]:
    return [h.name for h in asyncio.run(hosts.returning(probe_with(answering)))]


def test_a_silent_host_is_left_out_and_back_as_soon_as_it_answers():
    clock = Clock()
    hosts = HostSet(list(NODES), 4, clock=clock)
    gone = asyncio.run(hosts.leave_out_silent(probe_with({"node0", "node2"})))
    assert [h.name for h in gone] == ["node1"] and hosts.ranks == 3
    assert returning(hosts, {"node0", "node2"}) == []      # still silent
    assert returning(hosts, {"node0", "node1", "node2"}) == ["node1"]
    hosts.take_back([NODES[1]])
    assert hosts.ranks == 4 and not hosts.left


def test_a_host_whose_rank_keeps_failing_stays_out_for_the_quarantine():
    clock = Clock()
    hosts = HostSet(list(NODES), 4, clock=clock)
    for _ in range(HOST_FAILURES):
        hosts.failed(3)                       # ranks 2 and 3 are node2's (slots=2)
    assert [h.name for h in hosts.left] == ["node2"] and hosts.ranks == 2
    everyone = {"node0", "node1", "node2"}
    clock.now += QUARANTINE_S - 1
    assert returning(hosts, everyone) == []   # it answers, but not yet
    clock.now += 1
    assert returning(hosts, everyone) == ["node2"]
    hosts.take_back([NODES[2]])
    for _ in range(HOST_FAILURES - 1):        # taken back: its count starts again
        hosts.failed(2)
    assert not hosts.left


def test_failures_not_in_a_row_and_the_last_host_leave_nothing_out():
    hosts = HostSet(list(NODES), 4, clock=Clock())
    for _ in range(3):
        for _ in range(HOST_FAILURES - 1):
            hosts.failed(0)
        hosts.stable()                        # a job ran long enough in between
    assert not hosts.left
    alone = HostSet([Host("solo", slots=2)], 2, clock=Clock())
    for _ in range(2 * HOST_FAILURES):
        alone.failed(1)
    assert not alone.left and alone.ranks == 2

