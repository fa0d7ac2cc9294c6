"""engine/head/lanes.py's and lane.py's policies without a pipeline: how a lane's runs and
KV operations are tagged with its slot and claimed, and how much speculation a lane may
start when other requests share the pipeline. Exactness of lanes on real ranks:
tests/test_serve.py."""

from __future__ import annotations

from types import SimpleNamespace

from pipeinfer.engine.head.lane import PipelineShare, SlotPipeline
from pipeinfer.engine.head.lanes import Lanes
from pipeinfer.engine.head.refill import REFILL
from pipeinfer.schedule.transaction import DecodeTx, seq_clear, seq_cp


class RecordingPipe:
    stage, n_stages, row_costs = None, 3, ()

    def __init__(self):
        self.sent, self.in_flight = [], 0

    def decode(self, tx, tokens):
        self.sent.append(("decode", tx))
        self.in_flight += 1

    def kv(self, ops):
        self.sent.append(("kv", ops))

    def cancel(self, run_ids):
        self.sent.append(("cancel", run_ids))


def test_a_slot_pipeline_tags_its_runs_and_kv_ops_and_claims_its_run_ids():
    pipe, owners = RecordingPipe(), {}
    view = SlotPipeline(pipe, 2, owners)
    view.lane = "lane-2"
    view.decode(DecodeTx(5, (0,), ((0,),), (True,)), [1])
    view.kv([seq_cp(1, 0, 0, 3), seq_clear()])
    view.cancel([5])
    (_, tx), (_, ops), cancel = pipe.sent
    assert tx.slot == 2 and tx.run_id == 5 and owners == {5: "lane-2"}
    assert [op.slot for op in ops] == [2, 2] and ops[0].dst == 0
    assert cancel == ("cancel", [5])


def lanes_with(n_active: int, n_finished: int = 0, in_flight: int = 0, n_refills: int = 0):
    pipe = RecordingPipe()
    pipe.in_flight = in_flight
    active = ([SimpleNamespace(finished=False, strategy="pipeinfer")] * n_active
              + [SimpleNamespace(finished=True, strategy="pipeinfer")] * n_finished
              + [SimpleNamespace(finished=False, strategy=REFILL)] * n_refills)
    return SimpleNamespace(pipe=pipe, active=active)


def test_alone_a_lane_speculates_up_to_max_runs():
    share = PipelineShare(lanes_with(1, n_finished=2, in_flight=4))
    assert share.limit(6) == 6 and share.load() == 4


def test_with_others_under_way_speculation_only_fills_idle_stages():
    """Two requests on 3 stages: a speculative run may start while fewer than 3 runs are in
    flight (a stage would idle), never beyond (the requests' own runs keep them busy)."""
    share = PipelineShare(lanes_with(2, in_flight=2))
    assert share.limit(6) == 3 and share.load() < share.limit(6)
    share = PipelineShare(lanes_with(4, in_flight=4))
    assert share.load() >= share.limit(6)
    assert PipelineShare(lanes_with(2)).limit(2) == 2   # --max-runs below the stages: kept


def test_a_request_starting_while_others_run_takes_the_busy_strategy():
    """--busy-strategy applies to a generation that starts while another is under way (a
    finished one does not count); alone, or with no busy strategy set, --strategy."""
    cfg = SimpleNamespace(strategy="pipeinfer", busy_strategy="speculative")
    assert Lanes.strategy_now(SimpleNamespace(cfg=cfg, active=[])) == "pipeinfer"
    lanes = lanes_with(0, n_finished=2)
    lanes.cfg = cfg
    assert Lanes.strategy_now(lanes) == "pipeinfer"
    lanes = lanes_with(1)
    lanes.cfg = cfg
    assert Lanes.strategy_now(lanes) == "speculative"
    lanes.cfg = SimpleNamespace(strategy="pipeinfer", busy_strategy=None)
    assert Lanes.strategy_now(lanes) == "pipeinfer"


def test_the_adaptive_pipeinfer_is_every_generation_s_alone_or_not():
    """--busy-strategy auto under pipeinfer: one scheduler that switches by itself
    (schedule/adaptive.py), so the first request, started alone, gets it too."""
    from pipeinfer.strategies import ADAPTIVE

    cfg = SimpleNamespace(strategy="pipeinfer", busy_strategy=ADAPTIVE.name)
    assert Lanes.strategy_now(SimpleNamespace(cfg=cfg, active=[])) == ADAPTIVE.name
    lanes = lanes_with(2)
    lanes.cfg = cfg
    assert Lanes.strategy_now(lanes) == ADAPTIVE.name


def test_a_generation_is_shared_while_another_is_unfinished():
    assert PipelineShare(lanes_with(2)).shared()
    assert not PipelineShare(lanes_with(1, n_finished=3)).shared()


def test_a_refill_the_request_follows_is_not_another_generation():
    """A request continuing the conversation its slot was refilling starts while the
    refill's runs are still out: it is alone all the same (its strategy, its speculation)."""
    starting = lanes_with(0, n_refills=1)   # (what Lanes.start sees before its lane)
    starting.cfg = SimpleNamespace(strategy="pipeinfer", busy_strategy="speculative")
    assert Lanes.strategy_now(starting) == "pipeinfer"
    share = PipelineShare(lanes_with(1, n_refills=1))
    assert not share.shared() and share.limit(6) == 6
