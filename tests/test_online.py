"""Online control between plans (energyopt/online, docs/online.md): the global
scheduler never sets a clock above the GPU's maximum or a power limit above its
cap, conserves requests, sheds only at a full queue, stays within its lookup
budget, and after a load step restores the SLO within RESTORE_S simulated
seconds where the epoch plan alone does not; the local scheduler and the
forecast-error headroom follow their stated rules."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from energyopt.catalog import Problem, resolve
from energyopt.online import (
    ErrorHeadroom,
    GlobalScheduler,
    GpuInfo,
    InstanceInfo,
    LocalScheduler,
    OnlineConfig,
    OnlinePolicy,
    OpLookups,
    RateMeter,
    chunk_ladder,
)
from energyopt.sim.arrivals import Arrivals
from energyopt.sim.engine import SimResult, Simulator
from energyopt.sim.passes import PassTables
from energyopt.sim.synthetic import diurnal_multiplier, poisson_arrivals
from energyopt.spec.evaluation import DiurnalLoad, Spike, Transitions
from energyopt.spec.plan import GpuPlan, Placement, Plan
from tests.test_sim_engine import H100, random_arrivals, shared_plan, split_plan, two_workloads

RESTORE_S = 15.0
"""Simulated seconds after a load step within which the online control restores
the SLO (every 10 s window of arrivals from then on meets it for >= 90 %)."""
STEP_S = 60.0
WINDOW_S = 180.0

PROBLEM = two_workloads(rate_a=18.0, rate_b=10.0, gpus=3)
LOOKUPS = OpLookups.build(PROBLEM)
TABLES = PassTables(PROBLEM, 4096)
CAPS = {g.id: PROBLEM.gpu_type(g.type).power_limit_max_w for g in PROBLEM.gpus}
MAX_CLOCK = PROBLEM.gpu_type(H100).max_sm_clock_mhz


def low_clock_plan(clock: int = 990) -> Plan:
    """One workload per GPU at a low clock, the third GPU off."""
    a, b = (w.rate_rps for w in PROBLEM.instance.workloads)
    return Plan(
        instance="sim-tiny",
        gpus=(
            GpuPlan(
                gpu="n0/0",
                type=H100,
                on=True,
                clock_mhz=clock,
                power_limit_w=700,
                placements=(Placement(workload="a", rate_rps=a),),
            ),
            GpuPlan(
                gpu="n0/1",
                type=H100,
                on=True,
                clock_mhz=clock,
                power_limit_w=700,
                placements=(Placement(workload="b", rate_rps=b),),
            ),
            GpuPlan(gpu="n0/2", type=H100, on=False),
        ),
    )


def step_arrivals(factor: float, seed: int = 1) -> Arrivals:
    """The workloads' rates until STEP_S, ``factor`` times them after (mean sizes)."""
    rng = np.random.default_rng(seed)
    return poisson_arrivals(
        PROBLEM.instance.workloads,
        lambda t: np.where(t < STEP_S, 1.0, factor),
        factor,
        WINDOW_S,
        0.0,
        rng,
    )


def window_attainment(sim: Simulator, width_s: float = 10.0) -> list[tuple[float, float]]:
    """(window start s, fraction of its arrivals whose TTFT met the SLO)."""
    req = sim.req
    arrival = np.asarray(req.arrival_s)
    first = np.asarray(req.first_token_s)
    slo = np.asarray(
        [PROBLEM.instance.workloads[w].slo.ttft_ms / 1e3 for w in req.workload], dtype=float
    )
    ok = (first >= 0) & (first - arrival <= slo)
    out = []
    for lo in np.arange(0.0, WINDOW_S, width_s):
        inside = (arrival >= lo) & (arrival < lo + width_s)
        if inside.any():
            out.append((float(lo), float(ok[inside].mean())))
    return out


def simulate(plan: Plan, arrivals: Arrivals, online: bool) -> tuple[Simulator, SimResult]:
    policy = OnlinePolicy(LOOKUPS) if online else None
    sim = Simulator(PROBLEM, arrivals, window_s=WINDOW_S, tables=TABLES, online=policy)
    return sim, sim.run(plan)


def assert_conserved(sim: Simulator, res: SimResult) -> None:
    assert res.arrived == len(sim.req.arrival_s)
    assert res.completed + res.unfinished + res.shed == res.arrived
    assert sum(sim.req.done) == res.completed
    assert sum(s.shed for s in res.stats) == res.shed
    assert res.unfinished >= 0


def assert_within_limits(res: SimResult) -> None:
    for _, gpu, clock, limit in res.clock_log:
        assert clock <= MAX_CLOCK
        assert limit is None or limit <= CAPS[gpu] + 1e-9


# -- the load step --------------------------------------------------------------------


def test_load_step_slo_restored_within_stated_seconds_where_the_plan_alone_is_not() -> None:
    arrivals = step_arrivals(1.45)
    plan = low_clock_plan()
    plain_sim, _ = simulate(plan, arrivals, online=False)
    online_sim, online = simulate(plan, arrivals, online=True)
    late = [att for lo, att in window_attainment(plain_sim) if lo >= STEP_S + RESTORE_S]
    assert min(late) < 0.5  # the step overloads the plan's clocks
    after = [att for lo, att in window_attainment(online_sim) if lo >= STEP_S + RESTORE_S]
    assert min(after) >= 0.9
    assert online.online is not None and online.online.boosts > 0
    assert_conserved(online_sim, online)
    assert_within_limits(online)
    # after the step the GPU of the stepped workload runs above the plan's clock
    assert any(t >= STEP_S and gpu == "n0/0" and c > 990 for t, gpu, c, _ in online.clock_log)


def test_boost_is_lowered_again_when_the_load_falls() -> None:
    rng = np.random.default_rng(4)
    arrivals = poisson_arrivals(
        PROBLEM.instance.workloads,
        lambda t: np.where((t >= 30.0) & (t < 60.0), 1.45, 0.6),
        1.45,
        WINDOW_S,
        0.0,
        rng,
    )
    sim, res = simulate(low_clock_plan(), arrivals, online=True)
    assert res.online is not None and res.online.boosts > 0 and res.online.restores > 0
    last = {}
    for _, gpu, clock, _ in res.clock_log:
        last[gpu] = clock
    assert last.get("n0/0", 990) == 990  # back at the plan's clock by the end
    assert_conserved(sim, res)


def test_persistent_error_at_max_clock_wakes_an_off_gpu() -> None:
    arrivals = step_arrivals(2.2, seed=2)
    sim, res = simulate(low_clock_plan(MAX_CLOCK), arrivals, online=True)
    assert res.online is not None and res.online.wakes >= 1
    assert res.instances_started >= 1
    assert res.meter.gpus["n0/2"].dynamic_j > 0  # the woken GPU served
    assert_conserved(sim, res)
    assert_within_limits(res)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), n=st.integers(0, 150), replan_at=st.floats(1.0, 29.0))
def test_online_control_conserves_requests_across_replans(
    seed: int, n: int, replan_at: float
) -> None:
    problem = two_workloads()
    arrivals = random_arrivals(seed, n, 30.0)
    sim = Simulator(
        problem,
        arrivals,
        window_s=30.0,
        drain_s=600.0,
        tables=PassTables(problem, 4096),
        transitions=Transitions(power_on_s=2.0, startup_s=0.5),
        online=OnlinePolicy(SMALL_LOOKUPS, OnlineConfig(wake_after_s=1.0)),
    )
    plans = iter([split_plan(problem), shared_plan(problem, 990)])
    res = sim.run(shared_plan(problem), epoch_s=replan_at / 2, replan=lambda _: next(plans, None))
    assert res.arrived == n
    assert res.completed + res.shed == n
    assert res.unfinished == 0
    assert sum(sim.req.done) == res.completed
    for _, _, clock, limit in res.clock_log:
        assert clock <= MAX_CLOCK
        assert limit is None or limit <= 700.0


SMALL_LOOKUPS = OpLookups.build(two_workloads())


# -- the global scheduler on its own ----------------------------------------------------


class View:
    """A hand-set instance state."""

    def __init__(self, queued: int = 0) -> None:
        self.queued = queued
        self.batch = 0
        self.kv_fraction = 0.0


class Recorder:
    """An actuator that records every action."""

    def __init__(self) -> None:
        self.clocks: list[tuple[str, int, float]] = []
        self.shares: list[tuple[int, int]] = []
        self.wakes: list[tuple[str, int, int]] = []

    def set_clock(self, gpu: str, clock_mhz: int, power_limit_w: float, now_s: float) -> None:
        self.clocks.append((gpu, clock_mhz, power_limit_w))

    def set_share(self, instance: int, share: int, now_s: float) -> None:
        self.shares.append((instance, share))

    def wake(self, gpu: str, workload: int, clock_mhz: int, now_s: float) -> None:
        self.wakes.append((gpu, workload, clock_mhz))


def scheduler(
    cap_w: float, views: list[View], config: OnlineConfig | None = None, share: int = 100
) -> tuple[GlobalScheduler, Recorder]:
    """Workload a on GPU n0/0 at 990 MHz (cap ``cap_w``); n0/1 and n0/2 off."""
    act = Recorder()
    ctl = GlobalScheduler(LOOKUPS, act, [0.4, 0.6], config)
    ctl.set_gpus(
        [
            GpuInfo("n0/0", H100, "n0", True, 990, MAX_CLOCK, cap_w, 200.0),
            GpuInfo("n0/1", H100, "n0", False, 990, MAX_CLOCK, cap_w, 200.0),
            GpuInfo("n0/2", H100, "n0", False, 990, MAX_CLOCK, cap_w, 200.0),
        ]
    )
    infos = [
        InstanceInfo(i, 0, "a", ("n0/0",), share, 1, 18.0, 0.0, False, v)
        for i, v in enumerate(views)
    ]
    ctl.set_instances(0, infos, 0.0)
    return ctl, act


@pytest.mark.parametrize("cap_w", [700.0, 330.0, 250.0])
def test_boosts_never_exceed_the_max_clock_or_the_cap(cap_w: float) -> None:
    view = View(queued=0)
    ctl, act = scheduler(cap_w, [view])
    now = 0.0
    for _ in range(400):  # 40 req/s: above the capacity at every clock below the max
        now += 0.025
        assert ctl.route(0, now) is not None or view.queued >= ctl.slots[0].queue_limit
    assert act.clocks or ctl.stats.capped > 0, "neither a boost nor a capped one"
    for _, clock, limit in act.clocks:
        assert clock <= MAX_CLOCK
        assert limit <= cap_w + 1e-9
    if cap_w >= 700:
        assert act.clocks[-1][1] == MAX_CLOCK
    else:
        assert ctl.stats.capped > 0
    assert ctl.stats.max_lookups <= ctl.budget
    assert ctl.stats.over_budget == 0


def test_an_open_slice_is_charged_its_decode_loop_from_the_start() -> None:
    """The power the scheduler books for a GPU (node budget, power limits) is its
    on-power plus, for each open slice, its fixed part (even before the slice
    carries any load) plus its marginal power per request/s x its observed rate."""
    on = LOOKUPS.on_power_w(H100, 990)
    row = LOOKUPS.table.lookup(workload="a", gpu_type=H100, clock_mhz=990, share=100)
    assert row["fixed_w"] > 0.1 * on
    for planned in (0.0, 5.0):
        ctl = GlobalScheduler(LOOKUPS, Recorder(), [0.4, 0.6])
        gpu = GpuInfo("n0/0", H100, "n0", True, 990, MAX_CLOCK, 700.0, 200.0)
        ctl.set_gpus([gpu])
        info = InstanceInfo(0, 0, "a", ("n0/0",), 100, 1, planned, 0.0, False, View())
        ctl.set_instances(0, [info], 0.0)
        ctl.set_gpus([gpu])  # books the GPU with its slice (the meter starts at the plan's rate)
        want = on + row["fixed_w"] + planned * row["marginal_w_per_rps"]
        assert ctl.node_power_w["n0"] == pytest.approx(want, rel=1e-12)
        assert LOOKUPS.slice_power_w("a", H100, 990, 100, planned) + on == pytest.approx(want)


def test_requests_are_shed_only_at_a_full_queue() -> None:
    view = View(queued=0)
    ctl, _ = scheduler(700.0, [view])
    limit = ctl.slots[0].queue_limit
    assert limit == math.ceil(2.0 * LOOKUPS.capacity_rps("a", H100, MAX_CLOCK, 100) * 0.4)
    assert ctl.route(0, 1.0) == 0
    view.queued = limit - 1
    assert ctl.route(0, 1.1) == 0
    view.queued = limit
    assert ctl.route(0, 1.2) is None
    assert ctl.stats.shed == 1 and ctl.stats.shed_by_workload == {0: 1}


def quarter_shares() -> Problem:
    """The two workloads with MPS shares in steps of 25 %."""
    base = two_workloads(gpus=1)
    opts = base.instance.options
    sharing = opts.sharing.model_copy(update={"levels_pct": (25, 50, 75, 100)})
    inst = base.instance.model_copy(
        update={"options": opts.model_copy(update={"sharing": sharing})}
    )
    return resolve(inst, "sim-tiny-quarters")


def test_an_idle_co_located_slice_gives_share_to_the_one_at_risk() -> None:
    busy, idle = View(queued=40), View(queued=0)
    act = Recorder()
    ctl = GlobalScheduler(OpLookups.build(quarter_shares()), act, [0.4, 0.6])
    ctl.set_gpus([GpuInfo("n0/0", H100, "n0", True, MAX_CLOCK, MAX_CLOCK, 700.0, 200.0)])
    ctl.set_instances(0, [InstanceInfo(0, 0, "a", ("n0/0",), 50, 1, 10.0, 0.0, False, busy)], 0.0)
    ctl.set_instances(1, [InstanceInfo(1, 1, "b", ("n0/0",), 50, 1, 1.0, 0.0, False, idle)], 0.0)
    ctl.slots[1].rate.value = 0.0
    ctl.route(0, 1.0)
    assert act.shares == [(1, 25), (0, 75)]
    assert ctl.stats.shifts == 1
    # calm again: the plan's shares come back after the hold time
    busy.queued = 0
    ctl.slots[0].rate.value = 0.0
    ctl.tick(0, 1.0 + ctl.cfg.hold_s + 0.1)
    assert act.shares[-2:] == [(0, 50), (1, 50)]


def test_route_spills_to_an_instance_not_at_risk() -> None:
    views = [View(queued=0), View(queued=0)]
    ctl, _ = scheduler(700.0, views, OnlineConfig(shift=False, wake=False))
    ctl.set_gpus(
        [
            GpuInfo("n0/0", H100, "n0", True, MAX_CLOCK, MAX_CLOCK, 700.0, 200.0),
            GpuInfo("n0/1", H100, "n0", True, MAX_CLOCK, MAX_CLOCK, 700.0, 200.0),
        ]
    )
    infos = [
        InstanceInfo(0, 0, "a", ("n0/0",), 100, 1, 18.0, 0.0, False, views[0]),
        InstanceInfo(1, 0, "a", ("n0/1",), 100, 1, 18.0, 0.0, False, views[1]),
    ]
    ctl.set_instances(0, infos, 0.0)
    views[0].queued = 30  # at risk at the max clock: nothing left but to spill
    chosen = [ctl.route(0, 1.0 + 0.01 * i) for i in range(20)]
    assert chosen.count(1) == 20


def test_lookup_budget_bounds_every_decision_in_simulation() -> None:
    _, res = simulate(low_clock_plan(), step_arrivals(1.6, seed=3), online=True)
    assert res.online is not None
    assert res.online.decisions == res.arrived
    assert 0 < res.online.max_lookups <= res.online_budget
    assert res.online.over_budget == 0


# -- parts ------------------------------------------------------------------------------


def test_rate_meter_reads_the_poisson_rate() -> None:
    rng = np.random.default_rng(0)
    meter = RateMeter(tau_s=5.0)
    t = 0.0
    reads = []
    for _ in range(20_000):
        t += float(rng.exponential(1 / 8.0))
        reads.append(meter.add(t))
    assert np.mean(reads[2000:]) == pytest.approx(8.0 + 1 / 5.0, rel=0.05)
    assert meter.read(t + 5.0) == pytest.approx(meter.value * math.exp(-1.0))


def test_error_headroom_is_one_plus_the_error_quantile_per_workload() -> None:
    h = ErrorHeadroom(2, quantile=0.9, epochs=2, default=1.1, max_headroom=1.5, min_samples=5)
    assert list(h.headroom()) == [1.1, 1.1]
    h.record(np.array([10.0, 10.0]), np.array([[10.0, 5.0]] * 4))
    assert list(h.headroom()) == [1.1, 1.1]  # 4 samples: not enough yet
    errors = np.linspace(0.0, 0.4, 10)
    h.record(np.array([10.0, 10.0]), np.stack([10.0 * (1 + errors), np.full(10, 20.0)], axis=1))
    got = h.headroom()
    samples = np.concatenate([np.zeros(4), errors])
    assert got[0] == pytest.approx(1.0 + np.quantile(samples, 0.9))
    assert got[1] == 1.5  # clipped at max_headroom
    for _ in range(2):  # older epochs leave the window
        h.record(np.array([10.0, 10.0]), np.full((10, 2), 5.0))
    assert list(h.headroom()) == [1.0, 1.0]


def ms_decode(n: int, context: float) -> tuple[float, float]:
    return 10.0 + 0.5 * n, 1.0


def ms_prefill(tokens: int) -> tuple[float, float]:
    return 0.02 * tokens, 0.01 * tokens


def test_local_scheduler_grows_the_chunk_on_ttft_risk_within_the_tbt_slo() -> None:
    assert chunk_ladder(512, 4096) == (128, 256, 512, 1024, 2048, 4096)
    local = LocalScheduler(
        batch_limit=20,
        prefill_tokens=512,
        base_chunk=512,
        max_chunk=4096,
        max_batch=256,
        ttft_ms=600,
        tbt_ms=60,
    )
    # calm: the plan's chunk and limit
    assert local.step(10, 500.0, 0.0, ms_decode, ms_prefill) == (20, 512)
    # TTFT at risk: the largest chunk whose iteration fits 0.9 x 60 ms: 15 + 0.02 c <= 54
    limit, chunk = local.step(10, 500.0, 400.0, ms_decode, ms_prefill)
    assert chunk == 1024
    assert 10.0 + 0.5 * 10 + 0.02 * chunk <= 54.0
    # nothing decoding: the largest chunk
    assert local.step(0, 0.0, 400.0, ms_decode, ms_prefill)[1] == 4096
    # at its limit the batch grows while one more request fits the TBT budget
    for _ in range(100):
        limit, chunk = local.step(local.limit, 500.0, 0.0, ms_decode, ms_prefill)
    assert 10.0 + 0.5 * limit + 0.02 * 512 <= 54.0 < 10.0 + 0.5 * (limit + 1) + 0.02 * 512
    # never below the plan's limit or chunk
    slow = LocalScheduler(
        batch_limit=20,
        prefill_tokens=512,
        base_chunk=512,
        max_chunk=4096,
        max_batch=256,
        ttft_ms=600,
        tbt_ms=10,
    )
    assert slow.step(20, 500.0, 400.0, ms_decode, ms_prefill) == (20, 512)


def test_diurnal_spikes_multiply_the_rate_inside_them() -> None:
    load = DiurnalLoad(
        kind="diurnal",
        load_scale=1.0,
        amplitude=0.0,
        spikes=(
            Spike(at_s=10, duration_s=5, factor=2.0),
            Spike(at_s=12, duration_s=5, factor=1.5),
        ),
    )
    m, top = diurnal_multiplier(load, 100.0)
    got = m(np.array([5.0, 11.0, 13.0, 16.0, 20.0]))
    assert list(got) == pytest.approx([1.0, 2.0, 3.0, 1.5, 1.0])
    assert top == pytest.approx(3.0)


def test_a_new_plan_refreshes_the_capacities_of_instances_it_keeps() -> None:
    view = View()
    ctl, _ = scheduler(700.0, [view])
    assert ctl.slots[0].capacity_rps == LOOKUPS.capacity_rps("a", H100, 990, 100)
    ctl.set_gpus([GpuInfo("n0/0", H100, "n0", True, 1410, MAX_CLOCK, 700.0, 200.0)])
    ctl.set_instances(0, [InstanceInfo(0, 0, "a", ("n0/0",), 100, 1, 18.0, 0.0, False, view)], 10.0)
    slot = ctl.slots[0]
    assert slot.capacity_rps == LOOKUPS.capacity_rps("a", H100, 1410, 100)
    assert slot.plan_capacity_rps == slot.capacity_rps
    assert slot.gpu is ctl.gpus["n0/0"] and slot in ctl.gpus["n0/0"].slots
