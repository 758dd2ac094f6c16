"""Per-workload tail rules of the online control (docs/online.md): the burst memory
(a slice at risk is raised at once to cover its part of its workload's recent burst
peak) and the local scheduler's TBT protection (a prefill chunk whose iteration at
the current clock would stall decoding requests past their TBT SLO is shrunk)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from energyopt.families.serving.loop import evaluate
from energyopt.online import LocalScheduler, OnlineConfig
from energyopt.online.local_scheduler import LocalConfig
from energyopt.sim.arrivals import Arrivals
from energyopt.sim.forecast import burst_peak_rps
from energyopt.spec.evaluation import Forecast, PlannerSpec, load_evaluation
from tests.test_online import MAX_CLOCK, View, ms_decode, ms_prefill, scheduler
from tests.test_online_bursts import arrival_times, at_top_clock

PLANNED_RPS = 18.0  # test_online.scheduler's instance, req/s
EVALUATE = Path(__file__).resolve().parents[1] / "instances" / "evaluate"


def clock_at_second_onset(config: OnlineConfig) -> tuple[int, int]:
    """(clock a queue at its risk level raises the GPU to, the plan's clock) at the onset
    of a second burst: a 2.5x burst of 20 s was served 60 s before; now the slice's
    meters read just below its capacity (they have not seen the burst yet) and its
    queue is one above its risk level."""
    view = View()
    ctl, _ = scheduler(700.0, [view], config)
    g = ctl.gpus["n0/0"]
    rng = np.random.default_rng(3)
    for t in arrival_times(rng, 2.5 * PLANNED_RPS, 0.0, 20.0):
        ctl.route(0, t)
    # the first burst's boosts are over: the plan's clock and capacity again
    ctl._set_clock(g, g.plan_clock, ctl._power(g, g.plan_clock), 20.0)
    g.boosted = False
    now = 80.0
    s = ctl.slots[0]
    s.rate.value = s.fast.value = 0.95 * s.capacity_rps
    s.rate.at_s = s.fast.at_s = now
    view.queued = int(ctl._queue_risk(s.capacity_rps, s.ttft_s)) + 1
    assert ctl._risk(s, now) == 2
    ctl._boost(s, now, 2)
    return g.clock, g.plan_clock


def test_burst_memory_raises_a_queue_at_risk_to_the_remembered_peak() -> None:
    """Without the memory a queue at its risk level raises the clock one step
    (``queue_boost_steps``); with it, at once to a clock covering the part of the burst
    the slice served 60 s before (about 2.5 x its planned rate), or the top clock."""
    base = {"queue_boost_steps": 1, "trim": False, "wake": False}
    clock_off, plan = clock_at_second_onset(OnlineConfig(**base))
    on = OnlineConfig(**base, burst_memory_s=300.0)
    clock_on, _ = clock_at_second_onset(on)
    ctl, _ = scheduler(700.0, [View()], on)
    clocks = ctl.lk.clocks[ctl.gpus["n0/0"].info.gpu_type]
    assert clocks.index(clock_off) == clocks.index(plan) + 1
    assert clock_on > clock_off
    top_cap = ctl.lk.capacity_rps("a", ctl.gpus["n0/0"].info.gpu_type, MAX_CLOCK, 100)
    cap_on = ctl.lk.capacity_rps("a", ctl.gpus["n0/0"].info.gpu_type, clock_on, 100)
    assert cap_on >= min(2.0 * PLANNED_RPS, top_cap)


def test_burst_memory_keeps_a_peak_one_to_two_windows_and_is_off_by_default() -> None:
    ctl, _ = scheduler(700.0, [View()], OnlineConfig(burst_memory_s=100.0))
    wl = ctl.workloads[0]
    rng = np.random.default_rng(5)
    for t in arrival_times(rng, 3.0 * PLANNED_RPS, 0.0, 20.0):
        ctl.route(0, t)
    peak = ctl._peak_rps(wl, 20.0)
    assert 2.0 * PLANNED_RPS < peak < 4.0 * PLANNED_RPS
    assert ctl._peak_rps(wl, 199.0) == peak  # the next window: still remembered
    assert ctl._peak_rps(wl, 200.0) == 0.0  # two windows on, with nothing in between
    plain, _ = scheduler(700.0, [View()])
    for t in arrival_times(rng, 3.0 * PLANNED_RPS, 0.0, 20.0):
        plain.route(0, t)
    assert plain._peak_rps(plain.workloads[0], 20.0) == 0.0
    assert plain._burst_need(plain.slots[0], 20.0) == 0.0


def local(protect: bool) -> LocalScheduler:
    """A slice planned with 2,048-token chunks and a 25 ms TBT SLO (budget 22.5 ms; an
    iteration above 50 ms stalls decode)."""
    return LocalScheduler(
        batch_limit=20,
        prefill_tokens=2048,
        base_chunk=512,
        max_chunk=4096,
        max_batch=256,
        ttft_ms=1200,
        tbt_ms=25,
        config=LocalConfig(protect_tbt=protect),
    )


def test_tbt_protection_shrinks_a_chunk_that_stalls_decode() -> None:
    """ms_prefill: 0.02 ms per token, decode of 10 requests 15 ms: the plan's 2,048-token
    chunk makes a 56 ms iteration, above 2 x 25 ms; 256 tokens make 20.1 ms, within
    0.9 x 25 ms (512 make 25.2 ms)."""
    assert local(False).step(10, 500.0, 0.0, ms_decode, ms_prefill)[1] == 2048
    assert local(True).step(10, 500.0, 0.0, ms_decode, ms_prefill)[1] == 256
    # nothing decoding: nothing to protect, the plan's chunk
    assert local(True).step(0, 0.0, 0.0, ms_decode, ms_prefill)[1] == 2048
    # TTFT at risk (waited above 0.3 x 1,200 ms): the prompt comes first
    assert local(True).step(10, 500.0, 400.0, ms_decode, ms_prefill)[1] == 2048


def test_tbt_protection_leaves_an_iteration_below_the_stall() -> None:
    """A 1,024-token plan chunk: 35.5 ms with 10 decoding, above the 22.5 ms budget but
    below the 50 ms stall: kept (a gap or two above the SLO do not move a request's
    mean time per token past it)."""
    sched = local(True)
    sched.plan_chunk = 1024
    assert sched.step(10, 500.0, 0.0, ms_decode, ms_prefill)[1] == 1024


def test_tbt_protection_takes_the_smallest_rung_when_none_fits() -> None:
    # 100 decoding requests: a 60 ms decode step alone exceeds the budget
    sched = local(True)
    sched.max_batch = sched.limit = 100
    assert sched.step(100, 500.0, 0.0, ms_decode, ms_prefill)[1] == sched.ladder[0]


def test_a_queue_on_a_harvested_gpu_raises_it_to_the_plan_even_when_its_rate_fits() -> None:
    """A queue at its risk level on a harvested GPU whose meters read a rate the lowered
    clock covers (a few long prompts, or a burst the meters have not seen yet) raises
    it to the plan's clock at once."""
    ctl = at_top_clock(OnlineConfig(trim=False))
    view = ctl.slots[0].info.view
    assert isinstance(view, View)
    g = ctl.gpus["n0/0"]
    clocks = ctl.lk.clocks[g.info.gpu_type]
    low = clocks[0]
    assert low < g.plan_clock
    ctl._set_clock(g, low, ctl._power(g, low), 1.0)
    s = ctl.slots[0]
    s.rate.value = s.fast.value = 0.1 * s.capacity_rps
    s.rate.at_s = s.fast.at_s = 10.0
    view.queued = int(ctl._queue_risk(s.capacity_rps, s.ttft_s)) + 1
    assert ctl._risk(s, 10.0) == 2
    ctl._boost(s, 10.0, 2)
    assert g.clock == g.plan_clock


def bursty_arrivals() -> Arrivals:
    """Two workloads over 60 s: a at 2 req/s with a 10-s burst at 8 req/s from 20 s,
    b at 1 req/s; one token each way (the rates are what matters)."""
    rng = np.random.default_rng(11)
    a = [
        *arrival_times(rng, 2.0, 0.0, 20.0),
        *arrival_times(rng, 8.0, 20.0, 30.0),
        *arrival_times(rng, 2.0, 30.0, 60.0),
    ]
    b = arrival_times(rng, 1.0, 0.0, 60.0)
    times = np.asarray(a + b)
    which = np.asarray([0] * len(a) + [1] * len(b))
    order = np.argsort(times, kind="stable")
    ones = np.ones(len(times), dtype=np.int64)
    return Arrivals(times[order], which[order], ones, ones, ("a", "b"))


def test_the_burst_peak_is_a_high_quantile_of_short_window_rates() -> None:
    arr = bursty_arrivals()
    fc = Forecast(method="trend", window_s=30.0)
    peak = burst_peak_rps(arr, 60.0, 60.0, fc, 60.0, 5.0, 1.0)
    mean = arr.count_between(0.0, 60.0) / 60.0
    assert peak[0] > 2.0 * mean[0]  # the burst, not the mean
    assert peak[1] < 3.0
    # the forecast's 30-s windows average the burst away
    assert arr.window_rates_rps(0.0, 60.0, 30.0)[:, 0].max() < peak[0]
    # at time 0 the first epoch is read (as the forecast does); no complete window: 0
    assert np.array_equal(burst_peak_rps(arr, 0.0, 60.0, fc, 60.0, 5.0, 1.0), peak)
    assert not burst_peak_rps(arr, 60.0, 60.0, fc, 60.0, 90.0, 1.0).any()


def test_the_tail_reserve_plans_each_workload_for_its_burst_peak() -> None:
    """Online planners plan at least ``tail_reserve`` x the burst peak of the history
    they forecast from; off (0) by default, when the plans follow the forecast alone."""
    spec = EVALUATE / "quickstart-bursty.yaml"
    online = PlannerSpec(name="online", kind="energyopt", solver="highs-exact", online=True)
    base = load_evaluation(spec).model_copy(update={"planners": (online,), "duration_s": 120.0})
    planned = {}
    for reserve in (0.0, 1.0):
        ev = base.model_copy(
            update={"online": base.online.model_copy(update={"tail_reserve": reserve})}
        )
        res = evaluate(ev, spec)
        planned[reserve] = np.asarray(res.runs[0].tally.planned_rps[0])
        o = ev.online
        peak = burst_peak_rps(
            res.arrivals, 0.0, ev.epoch_s, ev.forecast, ev.duration_s, o.tail_window_s, 0.99
        )
    assert np.all(planned[1.0] >= peak - 1e-9)
    assert np.any(planned[0.0] < peak)
    assert np.all(planned[1.0] >= planned[0.0])


def test_the_harvest_start_floor_keeps_a_clock_that_starts_enough_requests() -> None:
    """Planned at the top clock and loaded at a tenth of its rate, the slice is harvested
    to the lowest clock without a floor; with a floor of n requests, to a clock whose
    capacity starts n within its 0.4-s TTFT SLO."""
    clocks_after = {}
    for floor in (0.0, 10.0):
        ctl = at_top_clock(OnlineConfig(harvest_margin=0.1, harvest_start_floor=floor))
        s = ctl.slots[0]
        s.rate.value = s.fast.value = 0.1 * PLANNED_RPS
        s.rate.at_s = s.fast.at_s = 10.0
        ctl.tick(0, 10.0)
        g = ctl.gpus["n0/0"]
        clocks_after[floor] = g.clock
        if floor > 0:
            assert ctl.lk.capacity_rps("a", g.info.gpu_type, g.clock, s.share) * 0.4 >= floor
    assert clocks_after[10.0] > clocks_after[0.0]
