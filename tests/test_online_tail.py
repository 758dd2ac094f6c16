"""Per-workload tail rules of the online control (docs/online.md): the burst memory
(a slice at risk is raised at once to cover its part of its workload's recent burst
peak) and the local scheduler's TBT protection (a prefill chunk whose iteration at
the current clock would stall decoding requests past their TBT SLO is shrunk)."""

from __future__ import annotations

import numpy as np

from energyopt.online import LocalScheduler, OnlineConfig
from energyopt.online.local_scheduler import LocalConfig
from tests.test_online import MAX_CLOCK, View, ms_decode, ms_prefill, scheduler
from tests.test_online_bursts import arrival_times, at_top_clock

PLANNED_RPS = 18.0  # test_online.scheduler's instance, req/s


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
