"""The fast path's scheduler on its own (no model, no device): the decisions `FastRunner` and `FastEngine` execute.

The exactness tests (test_engine_fast.py) show that executing these plans serves the reference engine's tokens;
here each decision is checked against the rule it states: the cache bound and the depth of steps in flight,
buckets, step-ahead, which prompts ride together, and how prompts are grouped into prefill forwards.
"""

from __future__ import annotations

import pytest

from dflash_bench.engine.config import StepConfig
from dflash_bench.engine.fast.scheduling import scheduler as sch
from dflash_bench.engine.fast.scheduling.scheduler import Row, Scheduler


def _sched(*, mixed: bool = False, step_ahead: bool = True, verify_width: str | int = "full", **kw) -> Scheduler:
    args: dict = dict(slots=6, block=4, max_len=64)
    args.update(kw)
    step = StepConfig(verify_width=verify_width, step_ahead=step_ahead, prefill="mixed" if mixed else "first",
                      kv_block=16)
    return Scheduler(step, **args)


def test_a_plan_takes_the_bucket_above_its_last_slot_and_the_kv_bucket_of_the_cache_bound():
    s = _sched()
    for slot in (0, 2):
        s.prefilled(slot, 10)
    p = s.plan([0, 2])
    # rows 0..3 run (buckets 1, 2, 4, 6), keys up to 10 + one whole block, rounded up to 16
    assert (p.kind, p.bs, p.L, p.width, p.slots) == ("dflash", 4, 16, 4, [0, 2])
    assert p.rows == ((0, 1), (2, 1))  # each slot's admission number
    q = s.plan([0, 2])  # behind one in flight: the bound assumes that one accepts a whole block too
    assert q.L == 32 and s.reach() == 8
    assert s.plan([0, 2]) is None  # DEPTH steps in flight: collect first


def test_no_step_is_planned_that_could_pass_the_cache():
    s = _sched()
    s.prefilled(0, 64 - 2 * 4 + 1)
    assert s.plan([0]) is not None  # room for one more block
    assert s.plan([0]) is None  # a second could pass the cache if the first accepted a whole block
    p = s.inflight[0]
    s.collected(p, {0: 1}, [], None)
    assert s.lengths[0] == 64 - 2 * 4 + 3 and not s.inflight


def test_steps_are_collected_in_order_and_released_or_readmitted_rows_are_not_current():
    s = _sched()
    for slot in (0, 1):
        s.prefilled(slot, 5)
    a, b = s.plan([0, 1]), s.plan([0, 1])
    with pytest.raises(RuntimeError):
        s.collected(b, {}, [], None)
    s.release(1)
    assert s.current(a) == [0]
    s.prefilled(1, 7)  # the slot taken by the next request: the steps in flight are not its
    assert s.current(a) == [0] and not s.covers([0, 1]) and s.covers([0])


def test_step_ahead_stops_for_logprobs_and_for_rows_that_could_finish_in_flight():
    s = _sched()
    s.prefilled(0, 5)
    assert len(s.schedule([Row(0)])) == 2  # one now, one ahead
    s = _sched()
    s.prefilled(0, 5)
    assert len(s.schedule([Row(0, logprobs=True)])) == 1
    assert s.schedule([Row(0, logprobs=True)]) == []  # the step in flight may hold its logits: read it first
    s = _sched()
    s.prefilled(0, 5)
    assert len(s.schedule([Row(0, left=4)])) == 1  # the step in flight may bring its 4 tokens
    s = _sched(step_ahead=False)
    s.prefilled(0, 5)
    assert len(s.schedule([Row(0)])) == 1  # no step ahead
    assert len(s.schedule([Row(0)], ahead=True)) == 1  # the one in flight covers the row: only the step ahead


def test_schedule_says_when_a_sequence_would_pass_the_cache():
    s = _sched()
    s.prefilled(0, 64)
    with pytest.raises(ValueError, match="cache length 64"):
        s.schedule([Row(0)])


def test_prompts_ride_a_few_a_step_oldest_first_while_rows_decode():
    s = _sched(block=1, mixed=True, ride_queue=4, max_len=128)
    assert not s.waits_to_ride([[1] * 10], logprobs=False)  # nothing decodes: prefilled at once
    s.prefilled(0, 8)
    assert s.waits_to_ride([[1] * 10], logprobs=False)
    assert not s.waits_to_ride([[1] * 10], logprobs=True)
    assert not s.waits_to_ride([[1] * 10] * 5, logprobs=False)  # a burst past the queue: at once
    assert not s.waits_to_ride([[1] * (sch.MIXED_TOKENS + 1)], logprobs=False)  # too long to ride
    s.queue.extend([(1, [1] * 10), (2, [2] * 20), (3, [3] * 30), (4, [4] * 40)])
    assert s.rows([0, 1, 2]) == [0] and s.waiting() == {1, 2, 3, 4}
    [p] = s.schedule([Row(0, left=1)])  # no step ahead: row 0 may finish with this one
    assert p.kind == "mixed" and [r.slot for r in p.rides] == [1, 2, 3] and p.P == 64  # max(MIXED_ROWS) at most
    assert list(s.queue) == [(4, [4] * 40)] and set(s.riding) == {1, 2, 3}
    s.release(2)  # gone while its prompt rides: not admitted
    s.collected(p, {0: 0}, [11, 12, 13], None)
    assert s.took == {1: 11, 3: 13} and s.lengths == {0: 9, 1: 10, 3: 30} and s.rode == 2


def test_no_plan_leaves_the_riders_waiting():
    s = _sched(block=1, mixed=True)
    s.prefilled(0, 64 - 1)
    s.queue.append((1, [1] * 10))
    assert s.plan([0]) is not None and s.schedule([Row(0)]) == []
    assert list(s.queue) == [(1, [1] * 10)] and not s.riding


def test_prefill_groups_hold_similar_lengths_within_the_token_budget(monkeypatch):
    monkeypatch.setattr(sch, "PREFILL_TOKENS", 100)
    s = _sched(slots=8, max_len=128)
    lengths = [40, 10, 30, 20, 45, 12]
    groups = s.prefill_groups(lengths)
    assert sorted(i for g, _ in groups for i in g) == list(range(6))
    for g, graphed in groups:
        assert len(g) * max(lengths[i] for i in g) <= 100 and graphed == (len(g) == 1)
    assert [g for g, _ in groups] == [[1, 5, 3], [2, 0], [4]]  # sorted by length, cut at the budget
    assert [graphed for _, graphed in _sched(slots=8, graphs=True).prefill_groups([5, 6])] == [True]  # GRAPHED_ROWS
    with pytest.raises(IndexError):
        s.prefill_groups([129])


def test_admission_takes_the_oldest_that_fit_the_free_slots_and_one_forward(monkeypatch):
    """The serving loop's cut: the oldest prompts, at most the free slots, while k x the longest fits the token
    budget; the oldest alone when it passes the budget; nothing read past the cut; and every batch it cuts is
    one prefill group."""
    monkeypatch.setattr(sch, "PREFILL_TOKENS", 100)
    s = _sched(slots=8, max_len=128)

    def whole(lengths):
        return [(n, False) for n in lengths]
    assert s.admission(whole([10, 20, 30, 10]), free=8) == 3  # 4 x 30 = 120 > 100
    assert s.admission(whole([30, 10, 10, 10]), free=8) == 3  # the longest so far counts: 4 x 30 > 100
    assert s.admission(whole([10] * 20), free=8) == 8 and s.admission(whole([10] * 20), free=2) == 2
    assert s.admission(whole([120, 10]), free=8) == 1 and s.admission(whole([10]), free=0) == 0
    assert s.admission([], free=8) == 0
    read = []
    assert s.admission(((read.append(n) or n, False) for n in [60, 60, 60, 60]), free=8) == 1 and read == [60, 60]
    lengths = [40, 10, 30, 20, 45, 12]
    k = s.admission(whole(lengths), free=8)
    assert k == 2 and len(s.prefill_groups(lengths[:k])) == 1


def test_tensor_parallel_ranks_admit_whole_prompts_a_graph_at_a_time():
    """With graphs on a tensor-parallel rank, a batch takes at most max(GRAPHED_ROWS) whole prompts (each batch one
    graph, not an eager forward), while resumed prompts (eager in any case) still go together up to the token
    budget; a group handed to prefill_groups is cut into graphs too. One rank, or no graphs: the token budget alone."""
    top = max(sch.GRAPHED_ROWS)
    par = _sched(slots=32, max_len=1024, graphs=True, parallel=True)
    assert par.whole_rows == top
    assert par.admission([(60, False)] * 20, free=32) == top
    assert par.admission([(60, True)] * 20, free=32) == 20  # resumes: one eager forward (20 x 60 within budget)
    mixed = [(60, True), (60, False), (60, True), (60, False), (60, False), (60, True), (60, False)]
    assert par.admission(mixed, free=32) == 6  # stops before the fourth whole prompt
    groups = par.prefill_groups([60 + i for i in range(11)])
    assert [len(g) for g, _ in groups] == [3, 3, 3, 2] and all(graphed for _, graphed in groups)
    assert sorted(i for g, _ in groups for i in g) == list(range(11))
    for one in (_sched(slots=32, max_len=1024, graphs=True), _sched(slots=32, max_len=1024, parallel=True)):
        assert one.whole_rows is None and one.admission([(60, False)] * 20, free=32) == 20
        assert [len(g) for g, _ in one.prefill_groups([60] * 11)] == [11]
