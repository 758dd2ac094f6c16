"""Serverless family (``kind: serverless``): the KV-transfer and cold-start terms
against the measured data, every solver against brute force on tiny instances, the
verifier's rejections (KV transfer over the TTFT SLO, a merged decode instance over
its memory), request conservation in the simulator with merging, bad input named
by file and field, and every CLI verb on the bundled instance."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from scipy.optimize import linprog

from energyopt.catalog.loader import builtin_catalog
from energyopt.cli import EXIT_BAD_INPUT, EXIT_OK, EXIT_VIOLATION, main
from energyopt.families import certify, family
from energyopt.families.serverless.formulations.milp import (
    DECODE,
    PREFILL_NET,
    PREFILL_NV,
    pool_capacity,
)
from energyopt.families.serverless.formulations.model import ServerlessProblem, build_problem
from energyopt.families.serverless.merge_policy import MergePolicy
from energyopt.families.serverless.sim import ConservationError, simulate
from energyopt.families.serverless.spec import (
    EpochPlan,
    Pool,
    Route,
    ServerlessFile,
    ServerlessPlan,
)
from energyopt.families.serverless.verify import DecodeInstanceState, check_merge
from energyopt.perf.coldstart import SAFETENSORS_H100_GBPS, measured_load_bandwidth_gbps
from energyopt.perf.kvtransfer import (
    NETWORK_H100,
    NETWORK_H100_CLUSTER00,
    NETWORK_H100_CLUSTER01,
    NVLINK_H100,
    kv_bytes,
    nccl_sendrecv_bandwidth_bps,
    transfer_s,
    ttft_budget_s,
    vidur_link,
)
from energyopt.sim.arrivals import Arrivals

from .cli_helpers import read_exported
from .spec_docs import tiny_serverless_doc as _doc

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "data" if (ROOT / "data").is_dir() else ROOT.parent / "shared" / "data"
SMALL = ROOT / "instances" / "serverless" / "azure-conv-small.yaml"
QUIET = lambda _msg: None  # noqa: E731


def run(capfd: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capfd.readouterr()
    return code, out, err


def _problem(**changes: Any) -> ServerlessProblem:
    return build_problem(ServerlessFile.model_validate(_doc(**changes)))


# --- the performance-model terms ---------------------------------------------


def test_kv_bytes_follow_the_architecture() -> None:
    llm = builtin_catalog().model("Llama-3.1-8B")
    # 2 (K, V) x 32 layers x 8 KV heads x 128 head dim x 2 bytes
    assert kv_bytes(llm, 1) == 2 * 32 * 8 * 128 * 2
    assert transfer_s(llm, 1000, NVLINK_H100) == pytest.approx(
        NVLINK_H100.latency_s + 1000 * 131072 / NVLINK_H100.bandwidth_bps
    )
    assert transfer_s(llm, 1000, NETWORK_H100) > 9 * transfer_s(llm, 1000, NVLINK_H100)
    assert ttft_budget_s(1.0, llm, 1000, NETWORK_H100) < 1.0


@pytest.mark.skipif(not DATA.is_dir(), reason="reference data not present")
def test_shipped_links_and_load_bandwidth_are_the_fits_of_the_data() -> None:
    for devices, link in ((2, NVLINK_H100), (1, NETWORK_H100)):
        fit = vidur_link(DATA / "network" / "vidur" / "h100_dgx" / "send_recv.csv", devices)
        assert fit.bandwidth_bps == pytest.approx(link.bandwidth_bps, rel=1e-3)
        assert fit.latency_s == pytest.approx(link.latency_s, rel=1e-2)
    nccl = DATA / "collectives" / "nccl-tests-cluster-h100" / "nccl_tests_parsed.csv"
    for cluster, link in (
        ("example-cluster01", NETWORK_H100_CLUSTER01),
        ("example-cluster00", NETWORK_H100_CLUSTER00),
    ):
        assert nccl_sendrecv_bandwidth_bps(nccl, cluster) == pytest.approx(
            link.bandwidth_bps, rel=5e-3
        )
    llm = builtin_catalog().model("Llama-3.1-8B")
    load = DATA / "serverless" / "serverlessllm" / "load_times.csv"
    got = measured_load_bandwidth_gbps(
        load, "meta-llama/Llama-3.1-8B-Instruct", "safetensors", llm.weight_bytes
    )
    assert got == pytest.approx(SAFETENSORS_H100_GBPS, rel=2e-3)


def test_a_slow_network_link_lowers_prefill_capacity_only_across_nodes() -> None:
    fast = _problem(nodes=[{"name": "n0", "gpus": 2}, {"name": "n1", "gpus": 2}])
    slow = _problem(
        nodes=[{"name": "n0", "gpus": 2}, {"name": "n1", "gpus": 2}],
        links={"network": {"latency_us": 10, "bandwidth_gbps": 0.2}},
    )
    assert np.allclose(fast.cap_prefill[:, :, 0], slow.cap_prefill[:, :, 0])
    assert np.all(slow.cap_prefill[:, :, 1] < fast.cap_prefill[:, :, 1])
    assert np.allclose(fast.cap_decode, slow.cap_decode)


# --- brute force -------------------------------------------------------------


def _one_node_optimum(p: ServerlessProblem, top: int = 4) -> float:
    """Optimum of a one-node instance by enumeration: counts of every (option,
    phase) per epoch, each phase's rate put on its cheapest instances first, cold
    starts and decode stops (drains) between epochs and after the last one."""
    kinds = (PREFILL_NV, DECODE)
    pools = [(o, k) for o in range(p.n_options) for k in kinds if pool_capacity(p, 0, o, k) > 0]
    gpus = p.gpus_of()
    per_epoch: list[list[tuple[tuple[int, ...], float]]] = []
    for t in range(p.n_epochs):
        demand = float(p.demand[0, t])
        options = []
        for counts in itertools.product(range(top + 1), repeat=len(pools)):
            if (
                sum(gpus[o] * c for (o, _), c in zip(pools, counts, strict=True))
                > p.node_gpus[0] + 1e-9
            ):
                continue
            cost = 0.0
            ok = True
            for k in kinds:
                phase = "decode" if k == DECODE else "prefill"
                mine = [(o, c) for (o, kk), c in zip(pools, counts, strict=True) if kk == k and c]
                cap = sum(pool_capacity(p, 0, o, k) * c for o, c in mine)
                if demand > 0 and cap < demand - 1e-9:
                    ok = False
                    break
                left = demand
                for o, c in sorted(mine, key=lambda oc: p.serve_cost(0, phase)[oc[0]]):
                    take = min(left, pool_capacity(p, 0, o, k) * c)
                    cost += take * float(p.serve_cost(0, phase)[o])
                    left -= take
                cost += sum(c * float(p.instance_cost(0)[o]) for o, c in mine)
            if ok and (demand > 0 or not any(counts)):
                options.append((counts, cost))
        per_epoch.append(options)
    best = np.inf
    for combo in itertools.product(*per_epoch):
        cost = sum(c for _, c in combo)
        before = (0,) * len(pools)
        for counts, _ in combo:
            for (o, k), now, was in zip(pools, counts, before, strict=True):
                cost += max(0, now - was) * float(p.start_cost(0)[o])
                if k == DECODE:
                    cost += max(0, was - now) * float(p.stop_cost(0)[o])
            before = counts
        for (o, k), was in zip(pools, before, strict=True):
            if k == DECODE:  # the plan ends with no instances: the last ones drain
                cost += was * float(p.stop_cost(0)[o])
        best = min(best, cost)
    return float(best)


def _two_node_optimum(p: ServerlessProblem, top: int = 3) -> float:
    """Optimum of a one-epoch, one-option, two-node gpu_seconds instance: counts in
    increasing cost, the first whose routes are feasible (an LP)."""
    assert p.n_epochs == 1 and p.n_options == 1 and p.n_nodes == 2
    demand = float(p.demand[0, 0])
    kinds = (PREFILL_NV, PREFILL_NET, DECODE)
    cap = [pool_capacity(p, 0, 0, k) for k in kinds]
    g = float(p.gpus_of()[0])
    cost_one = float(p.instance_cost(0)[0] + p.start_cost(0)[0])
    drain = float(p.stop_cost(0)[0])  # a decode instance drains after the epoch

    def cost(counts: tuple[int, ...]) -> float:
        return sum(counts) * cost_one + (counts[2] + counts[5]) * drain

    kv = float(p.kv_request_bytes[0]) / 1e9
    grid = sorted(itertools.product(range(top + 1), repeat=6), key=cost)
    for counts in grid:
        x = np.array(counts).reshape(2, 3)  # node x kind
        if np.any(x.sum(axis=1) * g > p.node_gpus + 1e-9):
            continue
        # routes r00, r01, r10, r11 >= 0
        a_ub = [
            [1, 0, 0, 0],
            [0, 0, 0, 1],  # local prefill
            [0, 1, 0, 0],
            [0, 0, 1, 0],  # network prefill
            [1, 0, 1, 0],
            [0, 1, 0, 1],  # decode on n0, n1
            [0, kv, 0, 0],
            [0, 0, kv, 0],  # NIC out of n0, n1
        ]
        b_ub = [
            cap[0] * x[0, 0],
            cap[0] * x[1, 0],
            cap[1] * x[0, 1],
            cap[1] * x[1, 1],
            cap[2] * x[0, 2],
            cap[2] * x[1, 2],
            p.nic_bps[0] / 1e9,
            p.nic_bps[1] / 1e9,
        ]
        res = linprog(np.zeros(4), A_ub=a_ub, b_ub=b_ub, A_eq=[[1, 1, 1, 1]], b_eq=[demand])
        if res.status == 0:
            return cost(counts)
    raise AssertionError("no plan in the enumerated range")


def _check_every_solver(p: ServerlessProblem, optimum: float) -> None:
    fam = family("serverless")
    for entry in fam.solvers():
        res = fam.solve(p, entry.name, time_limit_s=30, rel_gap=1e-9, progress=QUIET)
        certify(fam, p, res, 1e-9, QUIET)
        assert res.plan is not None, (entry.name, res.log)
        assert fam.verify(p, res.plan) == []
        assert res.objective is not None and res.objective >= optimum * (1 - 1e-6), entry.name
        if entry.guarantee != "heuristic":
            assert res.bound is not None and res.bound <= optimum * (1 + 1e-6), entry.name
        if entry.guarantee == "exact":
            assert res.objective == pytest.approx(optimum, rel=1e-6), entry.name


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_solver_against_brute_force_on_one_node(seed: int) -> None:
    rng = np.random.default_rng(seed)
    demand = [float(d) for d in rng.uniform(2.0, 24.0, 2).round(2)]
    kind = ("gpu_seconds", "energy", "weighted")[seed]
    p = _problem(
        models=[dict(_doc()["models"][0], demand_rps=demand)],
        objective={"kind": kind, "energy_weight_per_j": 1e-3},
    )
    _check_every_solver(p, _one_node_optimum(p))


@pytest.mark.parametrize("seed", [0, 1])
def test_every_solver_against_brute_force_on_two_nodes(seed: int) -> None:
    rng = np.random.default_rng(10 + seed)
    demand = round(float(rng.uniform(10.0, 30.0)), 2)
    p = _problem(
        nodes=[{"name": "n0", "gpus": 1}, {"name": "n1", "gpus": 2, "nic_gbps": 1.0}],
        options={"shares_pct": [50], "clocks_mhz": [1980], "max_batch": 64},
        models=[dict(_doc()["models"][0], demand_rps=[demand])],
    )
    _check_every_solver(p, _two_node_optimum(p))


def test_the_milp_at_its_time_limit_never_returns_more_than_the_fast_plan() -> None:
    """The bundled 58-epoch instance in 2 s: HiGHS' incumbent then costs more than the
    fast algorithm's plan (or there is none), so ``milp`` and ``auto`` report the
    fast plan, still with the MILP's bound below it, and say so."""
    fam = family("serverless")
    p = fam.load(str(ROOT / "instances" / "serverless" / "azure-conv-2x8-h100.yaml"), [])
    fast = fam.solve(p, "fast", time_limit_s=2, rel_gap=1e-4, progress=QUIET)
    certify(fam, p, fast, 1e-4, QUIET)
    assert fast.objective is not None
    for name in ("milp", "auto"):
        res = fam.solve(p, name, time_limit_s=2, rel_gap=1e-4, progress=QUIET)
        certify(fam, p, res, 1e-4, QUIET)
        assert res.plan is not None and res.objective is not None, name
        assert res.objective <= fast.objective * (1 + 1e-9), name
        assert res.bound is not None and res.bound <= res.objective, name
        if res.objective == pytest.approx(fast.objective, rel=1e-12):
            assert "plan from the fast algorithm" in res.algorithm, name


# --- the verifier --------------------------------------------------------------


def _two_node_plan(
    p: ServerlessProblem, prefill_node: str, link: str, rate: float
) -> ServerlessPlan:
    pools = (
        Pool(
            model="chat",
            phase="prefill",
            node=prefill_node,
            share_pct=100,
            tp=1,
            clock_mhz=1980,
            link=link,
            count=1,
            rate_rps=rate,
        ),  # type: ignore[arg-type]
        Pool(
            model="chat",
            phase="decode",
            node="n1",
            share_pct=100,
            tp=1,
            clock_mhz=1980,
            count=1,
            rate_rps=rate,
        ),
    )
    route = Route(model="chat", prefill_node=prefill_node, decode_node="n1", rate_rps=rate)
    return ServerlessPlan(epochs=(EpochPlan(epoch=0, pools=pools, routes=(route,)),))


def test_the_verifier_rejects_a_kv_transfer_that_breaks_the_ttft_slo() -> None:
    nodes = [{"name": "n0", "gpus": 2}, {"name": "n1", "gpus": 2}]
    model = dict(_doc()["models"][0], demand_rps=[8.0])
    fam = family("serverless")
    ok = _problem(nodes=nodes, models=[model])
    slow = _problem(
        nodes=nodes, models=[model], links={"network": {"latency_us": 10, "bandwidth_gbps": 0.12}}
    )
    assert fam.verify(ok, _two_node_plan(ok, "n0", "network", 8.0)) == []
    assert fam.verify(slow, _two_node_plan(slow, "n1", "nvlink", 8.0)) == []
    broken = fam.verify(slow, _two_node_plan(slow, "n0", "network", 8.0))
    assert [v.kind for v in broken] == ["ttft"]
    assert "KV transfer over network" in broken[0].message


def test_the_verifier_rejects_over_memory_routes_and_gpus() -> None:
    p = _problem(
        models=[dict(_doc()["models"][0], demand_rps=[10.0])],
        options={"shares_pct": [25, 50, 100], "clocks_mhz": [1980], "max_batch": 64},
    )
    fam = family("serverless")
    pools = (
        Pool(
            model="chat",
            phase="prefill",
            node="n0",
            share_pct=100,
            tp=1,
            clock_mhz=1980,
            link="nvlink",
            count=1,
            rate_rps=10.0,
        ),
        Pool(
            model="chat",
            phase="decode",
            node="n0",
            share_pct=25,
            tp=1,
            clock_mhz=1980,
            count=1,
            rate_rps=10.0,
        ),
    )
    plan = ServerlessPlan(
        epochs=(
            EpochPlan(
                epoch=0,
                pools=pools,
                routes=(Route(model="chat", prefill_node="n0", decode_node="n0", rate_rps=10.0),),
            ),
        )
    )
    kinds = {v.kind for v in fam.verify(p, plan)}
    assert "memory" in kinds or "capacity" in kinds
    crowded = ServerlessPlan(
        epochs=(
            EpochPlan(
                epoch=0,
                pools=(pools[0].model_copy(update={"count": 3}), pools[1]),
                routes=plan.epochs[0].routes,
            ),
        )
    )
    assert "gpus" in {v.kind for v in fam.verify(p, crowded)}
    short = ServerlessPlan(
        epochs=(
            EpochPlan(
                epoch=0,
                pools=pools,
                routes=(Route(model="chat", prefill_node="n0", decode_node="n0", rate_rps=4.0),),
            ),
        )
    )
    assert {"demand", "route"} <= {v.kind for v in fam.verify(p, short)}


def test_the_merge_check_rejects_memory_loss_and_duplicates() -> None:
    a = DecodeInstanceState("a", kv_budget_bytes=10e9, max_batch=4, requests={1: 4e9, 2: 4e9})
    b = DecodeInstanceState("b", kv_budget_bytes=10e9, max_batch=4, requests={3: 4e9})
    over = check_merge([a, b], {3: "a"}, ["b"])
    assert [v.kind for v in over] == ["memory"]
    fits = check_merge([a, DecodeInstanceState("b", 10e9, 4, {3: 1e9})], {3: "a"}, ["b"])
    assert fits == []
    lost = check_merge([a, b], {}, ["b"])
    assert [v.kind for v in lost] == ["merge"] and "lost" in lost[0].message
    twice = check_merge([a, DecodeInstanceState("b", 10e9, 4, {1: 1e9})], {}, [])
    assert "merge" in {v.kind for v in twice}
    full = check_merge([a, DecodeInstanceState("b", 100e9, 1, {3: 1e9})], {1: "b"}, ["a"])
    assert {v.kind for v in full} == {"batch", "merge"}


# --- the simulator -------------------------------------------------------------


def _arrivals(rate: float, seconds: float, seed: int) -> Arrivals:
    rng = np.random.default_rng(seed)
    n = int(rate * seconds)
    t = np.sort(rng.uniform(0, seconds, n))
    return Arrivals(
        time_s=t,
        workload=np.zeros(n, dtype=np.int64),
        prompt_tokens=rng.integers(200, 2000, n).astype(np.int64),
        output_tokens=rng.integers(20, 400, n).astype(np.int64),
        names=("chat",),
    )


def test_merging_conserves_requests_and_frees_gpus() -> None:
    nodes = [{"name": "n0", "gpus": 2}, {"name": "n1", "gpus": 2}]
    p = _problem(nodes=nodes, models=[dict(_doc()["models"][0], demand_rps=[40.0, 40.0])])
    fam = family("serverless")
    res = fam.solve(p, "fast", time_limit_s=10, rel_gap=1e-6, progress=QUIET)
    assert res.plan is not None
    arrivals = _arrivals(4.0, 120.0, 3)  # far below the plan's 40 rps: decode is fragmented
    plain = simulate(p, res.plan, arrivals)
    merged = simulate(p, res.plan, arrivals, MergePolicy(merge_interval_s=5.0))
    for r in (plain, merged):
        assert r.requests == r.finished == len(arrivals)
    assert merged.merges > 0 and merged.migrated_bytes > 0
    assert merged.gpu_s < plain.gpu_s
    assert merged.tokens == pytest.approx(plain.tokens, rel=0.01)


def test_a_merge_that_would_lose_a_request_stops_the_simulation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import energyopt.families.serverless.sim as sim

    nodes = [{"name": "n0", "gpus": 2}, {"name": "n1", "gpus": 2}]
    p = _problem(nodes=nodes, models=[dict(_doc()["models"][0], demand_rps=[40.0, 40.0])])
    res = family("serverless").solve(p, "fast", time_limit_s=10, rel_gap=1e-6, progress=QUIET)
    assert res.plan is not None
    real = sim.check_merge
    monkeypatch.setattr(
        sim,
        "check_merge",
        lambda before, moves, released: real(before, dict(list(moves.items())[1:]), released),
    )
    with pytest.raises(ConservationError):
        simulate(p, res.plan, _arrivals(4.0, 120.0, 3), MergePolicy())


# --- files and the command line -------------------------------------------------


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"epoch_s": -1}, "epoch_s"),
        ({"options": {"shares_pct": [30]}}, "options.shares_pct"),
        ({"options": {"shares_pct": [20, 50]}}, "options.shares_pct"),
        ({"options": {"tp": [3]}}, "options.tp"),
        ({"options": {"clocks_mhz": [99999]}}, "options.clocks_mhz"),
        ({"gpu": "H999"}, "gpu"),
        ({"nodes": [{"name": "n0", "gpus": 2}, {"name": "n0", "gpus": 2}]}, "(top level)"),
        ({"models": [dict(_doc()["models"][0], model="GPT-9")]}, "models[0](chat).model"),
        ({"models": [dict(_doc()["models"][0], demand_rps=[1, -2])]}, "models[0](chat)"),
        (
            {"models": [dict(_doc()["models"][0], slo={"ttft_ms": 1, "tbt_ms": 50})]},
            "models[0](chat).slo",
        ),
        ({"cold_start": {"bandwidth_gbps": 0}}, "cold_start.bandwidth_gbps"),
    ],
)
def test_bad_input_names_file_and_field(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], change: dict[str, Any], field: str
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(_doc(**change)))
    code, _, err = run(capfd, "validate", str(path))
    assert code == EXIT_BAD_INPUT
    assert f"{path}: {field}" in err and "Traceback" not in err


def test_every_cli_verb_on_the_bundled_instance(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    path = str(SMALL)
    code, out, _ = run(capfd, "validate", path)
    assert code == EXIT_OK and "1 models, 2 nodes" in out and "10 epochs" in out
    code, out, _ = run(capfd, "show", path)
    assert code == EXIT_OK and "Llama-3.1-8B" in out
    plan = tmp_path / "plan.json"
    code, out, err = run(capfd, "solve", path, "--solver", "milp", "-q", "-o", str(plan))
    assert code == EXIT_OK, err
    assert "status optimal" in out
    data = json.loads(plan.read_text())
    code, out, err = run(capfd, "verify", path, str(plan))
    assert code == EXIT_OK and "feasible" in out, err
    bad = dict(data, objective=data["objective"] * 1.5)
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    code, _, err = run(capfd, "verify", path, str(tmp_path / "bad.json"))
    assert code == EXIT_VIOLATION and "[objective]" in err
    export = tmp_path / "serverless.mps"
    code, _, err = run(capfd, "export", path, "-o", str(export))
    assert code == EXIT_OK, err
    h = read_exported(export)
    h.setOptionValue("mip_rel_gap", 1e-9)
    h.run()
    assert h.getInfo().objective_function_value == pytest.approx(data["objective"], rel=1e-6)
    for kind in ("serverless", "serverless-plan"):
        code, out, _ = run(capfd, "schema", kind)
        assert code == EXIT_OK and json.loads(out)["type"] == "object"


def test_bad_plan_file_is_named(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"epochs": [{"epoch": 0, "pools": [{"model": "chat"}]}]}))
    code, _, err = run(capfd, "verify", str(SMALL), str(plan))
    assert code == EXIT_BAD_INPUT and f"{plan}: epochs[0].pools[0]" in err


def test_the_rate_table_holds_the_direct_solves(tmp_path: Path) -> None:
    from energyopt.families.serverless.formulations.model import load_serverless
    from energyopt.families.serverless.tables import RateTable, compile_rate_table, rate_problem
    from energyopt.tables.format import TableError

    base = load_serverless(SMALL)
    path = tmp_path / "rates.tbl"
    got = compile_rate_table(base, [5.0, 20.0], path)
    table = RateTable.open(path)
    fam = family("serverless")
    for rate in (5.0, 20.0):
        p = rate_problem(base, 0, rate)
        res = fam.solve(p, "milp", time_limit_s=30, rel_gap=1e-6, progress=QUIET)
        certify(fam, p, res, 1e-6, QUIET)
        assert got[("chat", rate)] == pytest.approx(res.objective, rel=1e-6)
    assert table.pools("chat", 3.0) == table.pools("chat", 5.0)  # ceil to the next grid rate
    assert table.pools("chat", 6.0) == table.pools("chat", 20.0)
    low, high = table.decode_instances("chat", 5.0), table.decode_instances("chat", 20.0)
    assert low is not None and high is not None and 1 <= low <= high
    assert table.pools("chat", 25.0) is None and table.pools("other", 5.0) is None
    (tmp_path / "bad.tbl").write_bytes(b"not a table")
    with pytest.raises(TableError):
        RateTable.open(tmp_path / "bad.tbl")


def test_mutated_serverless_files_are_refused_cleanly_or_solved(tmp_path: Path) -> None:
    """Deleted keys, wrong types, non-finite, extreme and repeated values anywhere in
    a serverless file: validate refuses them naming the file, or the exact, LP and
    fast solvers return a result whose plan (if any) the verifier accepts."""
    from .mutations import check_family_file_mutations

    check_family_file_mutations(tmp_path, _doc(), ("milp", "lp", "fast"), max_examples=20)


_REPLAY = """
from tests.test_serverless import QUIET, _arrivals, _doc, _problem
from energyopt.families import family
from energyopt.families.serverless.merge_policy import MergePolicy
from energyopt.families.serverless.sim import simulate

nodes = [{"name": "n0", "gpus": 2}, {"name": "n1", "gpus": 2}]
p = _problem(nodes=nodes, models=[dict(_doc()["models"][0], demand_rps=[40.0, 20.0, 40.0])])
res = family("serverless").solve(p, "fast", time_limit_s=10, rel_gap=1e-6, progress=QUIET)
r = simulate(p, res.plan, _arrivals(6.0, 180.0, 3))
print(repr(r.energy_j), repr(r.gpu_s))
"""


def test_a_replay_is_the_same_in_every_process() -> None:
    """The simulator's result does not depend on Python's string hashing (pools were
    started in set order, which fixed instance ids and so the routing)."""
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    outs = []
    for seed in ("0", "1"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        done = subprocess.run(
            [sys.executable, "-c", _REPLAY], cwd=root, env=env, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr
        outs.append(done.stdout)
    assert outs[0] == outs[1]


def _two_node_forecast(rps: float) -> ServerlessProblem:
    nodes = [{"name": "n0", "gpus": 2}, {"name": "n1", "gpus": 2}]
    return _problem(nodes=nodes, models=[dict(_doc()["models"][0], demand_rps=[rps, rps])])


def test_prefill_scaling_follows_a_calm_load_below_the_plan() -> None:
    p = _two_node_forecast(40.0)
    res = family("serverless").solve(p, "fast", time_limit_s=10, rel_gap=1e-6, progress=QUIET)
    assert res.plan is not None
    arrivals = _arrivals(20.0, 120.0, 5)  # half the forecast, steady: prefill can shrink
    merge_only = simulate(p, res.plan, arrivals, MergePolicy())
    scaled = simulate(p, res.plan, arrivals, MergePolicy(prefill_headroom=0.1, surge_ratio=2.5))
    for r in (merge_only, scaled):
        assert r.requests == r.finished == len(arrivals)
    assert scaled.gpu_s < 0.85 * merge_only.gpu_s
    assert scaled.ttft_attainment >= merge_only.ttft_attainment - 0.01


def test_the_surge_gate_keeps_the_plans_prefill_for_a_surge_it_announces() -> None:
    p = _two_node_forecast(40.0)
    res = family("serverless").solve(p, "fast", time_limit_s=10, rel_gap=1e-6, progress=QUIET)
    assert res.plan is not None
    quiet, surge = _arrivals(3.0, 60.0, 6), _arrivals(40.0, 60.0, 7)
    arrivals = Arrivals(
        time_s=np.concatenate([quiet.time_s, surge.time_s + 60.0]),
        workload=np.concatenate([quiet.workload, surge.workload]),
        prompt_tokens=np.concatenate([quiet.prompt_tokens, surge.prompt_tokens]),
        output_tokens=np.concatenate([quiet.output_tokens, surge.output_tokens]),
        names=("chat",),
    )
    gated = simulate(p, res.plan, arrivals, MergePolicy(prefill_headroom=0.1))
    blind = simulate(p, res.plan, arrivals, MergePolicy(prefill_headroom=0.1, surge_ratio=1e9))
    plain = simulate(p, res.plan, arrivals, MergePolicy())
    late = simulate(
        p,
        res.plan,
        arrivals,
        MergePolicy(prefill_headroom=0.1, surge_ratio=1e9, prefill_wait_s=1e9),
    )
    for r in (gated, blind, plain, late):
        assert r.requests == r.finished == len(arrivals)
    # released prefill could not come back within a cold start: the surge's first
    # prompts wait; the gate (forecast 40 rps against 3 observed) keeps the plan's
    assert blind.ttft_attainment < plain.ttft_attainment - 0.02
    assert gated.ttft_attainment >= plain.ttft_attainment - 0.005
    assert blind.gpu_s < gated.gpu_s
    # without the queue trigger, capacity waits for the next 5-s step to grow
    assert late.ttft_attainment < blind.ttft_attainment - 0.1


def test_a_negative_prefill_headroom_is_refused() -> None:
    with pytest.raises(ValueError, match="prefill_headroom"):
        MergePolicy(prefill_headroom=-0.1)
    with pytest.raises(ValueError, match="surge_ratio"):
        MergePolicy(prefill_headroom=0.1, surge_ratio=0.5)


def test_decode_kept_at_slo_capacity_never_falls_short_of_the_observed_rate() -> None:
    """With ``headroom = load_fraction - 1`` the decode instances kept (up or loading)
    must cover the observed rate at their modelled SLO capacity (planned capacity /
    load fraction) after every merge step, up to what the plan's pools hold; and
    the policy frees no fewer GPU-seconds than at the planned capacity."""
    from energyopt.families.serverless.figures import plan_targets
    from energyopt.families.serverless.sim import _Sim

    p = _two_node_forecast(40.0)
    res = family("serverless").solve(p, "fast", time_limit_s=10, rel_gap=1e-6, progress=QUIET)
    assert res.plan is not None
    lf = p.spec.options.load_fraction
    policy = MergePolicy(headroom=lf - 1.0)
    checked = []

    class Checked(_Sim):
        def consolidate(self, now: float, forecast: bool = False) -> None:
            super().consolidate(now, forecast)
            figs = self.figures_of(0)
            want = self.targets[min(self.epoch, self.p.n_epochs - 1)]
            planned = sum(figs[k[2]].capacity_rps * c for k, c in want.items() if k[3] == "decode")
            held = sum(
                figs[i.key[2]].capacity_rps
                for i in self.instances.values()
                if i.key[3] == "decode" and i.released_at is None and not i.draining
            )
            need = float(self.rate_est[0]) * lf
            assert held >= min(need, planned) - 1e-9, (now, held, need, planned)
            checked.append(need)

    # a load that falls to a quarter and comes back: decode is merged, then restarted
    low, high = _arrivals(10.0, 60.0, 8), _arrivals(36.0, 60.0, 9)
    arrivals = Arrivals(
        time_s=np.concatenate([high.time_s, low.time_s + 60.0]),
        workload=np.concatenate([high.workload, low.workload]),
        prompt_tokens=np.concatenate([high.prompt_tokens, low.prompt_tokens]),
        output_tokens=np.concatenate([high.output_tokens, low.output_tokens]),
        names=("chat",),
    )
    got = Checked(p, plan_targets(p, res.plan), arrivals, policy).run()
    assert got.requests == got.finished == len(arrivals)
    assert len(checked) > 10 and max(checked) > 0
    at_plan = simulate(p, res.plan, arrivals, MergePolicy())
    assert got.gpu_s <= at_plan.gpu_s + 1e-6
    assert got.tbt_attainment >= at_plan.tbt_attainment - 0.01
    with pytest.raises(ValueError, match="headroom"):
        MergePolicy(headroom=-1.0)


def _decode_per_epoch(plan: Any) -> list[tuple[int, float]]:
    """(decode instances, decode GPUs) in each epoch of a serverless plan."""
    return [
        (
            sum(pl.count for pl in ep.pools if pl.phase == "decode"),
            sum(pl.count * pl.tp * pl.share_pct / 100 for pl in ep.pools if pl.phase == "decode"),
        )
        for ep in plan.epochs
    ]


@pytest.mark.parametrize("name", ["azure-conv-small", "azure-conv-2x8-h100"])
def test_the_fast_algorithm_at_decode_capacity_never_needs_more_decode(name: str) -> None:
    """``solve_fast``'s default plans decode at the file's load fraction (the plan
    and cost of giving it explicitly, accepted by the verifier); decode at its full
    modelled SLO capacity (1.0, the benchmark's ``autoscale, decode at capacity``)
    never holds more decode instances or GPUs in an epoch than at the file's 0.85,
    and no decode pool above that capacity."""
    from energyopt.families.serverless.formulations.model import build_problem, load_serverless
    from energyopt.families.serverless.solvers.fast import solve_fast

    p = load_serverless(ROOT / "instances" / "serverless" / f"{name}.yaml")
    lf = p.spec.options.load_fraction
    assert lf == pytest.approx(0.85)
    default = solve_fast(p)
    explicit = solve_fast(p, decode_load_fraction=lf)
    assert default.plan is not None and explicit.plan is not None
    assert default.plan == explicit.plan and default.objective == explicit.objective
    assert family("serverless").verify(p, default.plan) == []
    full = solve_fast(p, decode_load_fraction=1.0)
    assert full.plan is not None and full.objective is not None
    # refused at the file's fraction, it is a verified plan of the same instance at
    # load fraction 1.0 (prefill pools are then below their capacity)
    assert family("serverless").verify(p, full.plan) != []
    options = p.spec.options.model_copy(update={"load_fraction": 1.0})
    at_capacity = build_problem(p.spec.model_copy(update={"options": options}), name)
    assert family("serverless").verify(at_capacity, full.plan) == []
    assert default.objective is not None and full.objective <= default.objective + 1e-9
    for t, ((n85, g85), (n100, g100)) in enumerate(
        zip(_decode_per_epoch(default.plan), _decode_per_epoch(full.plan), strict=True)
    ):
        assert n100 <= n85 and g100 <= g85 + 1e-9, (t, n85, n100)
    opts = {(o.share_pct, o.tp, o.clock_mhz): i for i, o in enumerate(p.options)}
    for ep in full.plan.epochs:
        for pl in ep.pools:
            if pl.phase == "decode":
                cap = p.cap_decode[0, opts[(pl.share_pct, pl.tp, pl.clock_mhz)]] / lf
                assert pl.rate_rps <= pl.count * cap * (1 + 1e-9)
    assert sum(n for n, _ in _decode_per_epoch(full.plan)) < sum(
        n for n, _ in _decode_per_epoch(default.plan)
    )
    with pytest.raises(ValueError, match="decode_load_fraction"):
        solve_fast(p, decode_load_fraction=1.5)
