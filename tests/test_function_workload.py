"""The function-workload generator (energyopt.families.keepalive.function_workload) against the
published statistics it targets, the Azure Functions 2021 trace format
(energyopt.families.keepalive.azure_functions), and the keep-alive instances built from a trace.

Tolerances: daily counts, execution times and memory are drawn by Latin hypercube
sampling, so 300 functions follow the target quantiles to within 1/300; what is
left is the Poisson noise of the counts at the thresholds (a function invoked about
24 times a day lands on either side) and the spread of per-function means. Each
tolerance below is stated where it is used.
"""

from __future__ import annotations

import gzip
import lzma
import math
from pathlib import Path

import numpy as np
import pytest
import yaml

from energyopt.cli import EXIT_OK, main
from energyopt.families.keepalive import function_workload as fw
from energyopt.families.keepalive import llm_functions
from energyopt.families.keepalive.azure_functions import (
    read_profiles,
    read_trace,
    write_profiles,
    write_trace,
)
from energyopt.families.keepalive.spec import KeepAliveFile
from energyopt.spec.errors import SpecError

ROOT = Path(__file__).resolve().parents[1]
BUNDLED = ROOT / "instances" / "keepalive" / "functions-200.yaml"


@pytest.fixture(scope="module")
def day() -> tuple[list[fw.FunctionProfile], fw.InvocationTrace, fw.WorkloadStatistics]:
    """300 functions over one day (seed 7) and the statistics of their trace."""
    profiles, trace = fw.generate(300, fw.DAY_S, seed=7)
    return profiles, trace, fw.workload_statistics(profiles, trace)


def test_targets_follow_the_published_points() -> None:
    # The log-normal of daily counts passes through both published points.
    z = fw._Z
    assert z.cdf((math.log10(24) - fw.LOG10_DAILY_MEAN) / fw.LOG10_DAILY_SIGMA) == pytest.approx(
        fw.SHARE_AT_MOST_HOURLY
    )
    assert z.cdf((math.log10(1440) - fw.LOG10_DAILY_MEAN) / fw.LOG10_DAILY_SIGMA) == pytest.approx(
        fw.SHARE_AT_MOST_PER_MINUTE
    )
    assert fw.MEMORY_MEDIAN_MB * math.exp(fw.MEMORY_LN_SIGMA * z.inv_cdf(0.9)) == pytest.approx(
        fw.MEMORY_P90_MB
    )
    assert sum(fw.TRIGGER_SHARES.values()) == pytest.approx(1.0)
    assert dict(fw.CLASS_SHARES) == pytest.approx({"timer": 0.16, "poisson": 0.55, "bursty": 0.29})
    k = fw.BURSTY_WEIBULL_SHAPE
    assert math.sqrt(math.gamma(1 + 2 / k) / math.gamma(1 + 1 / k) ** 2 - 1) > 2.0


def test_invocation_rates_are_heavy_tailed(day: tuple) -> None:
    _, _, st = day
    # 0.05: 15 of 300 functions, about three times the Poisson noise of the counts
    # of the functions within a factor 2 of each threshold.
    assert st.share_at_most_hourly == pytest.approx(fw.SHARE_AT_MOST_HOURLY, abs=0.05)
    assert st.share_at_most_per_minute == pytest.approx(fw.SHARE_AT_MOST_PER_MINUTE, abs=0.05)
    # Expected daily counts span the 8 published decades; the counts seen in one day
    # (the least invoked function seen once) more than 5.
    assert st.decades_expected == pytest.approx(fw.DAILY_SPAN_DECADES, abs=0.01)
    assert st.decades_observed > 5.0


def test_inter_arrival_cv_per_class(day: tuple) -> None:
    profiles, trace, st = day
    classes = [p.arrival for p in profiles]
    for c in fw.ARRIVAL_CLASSES:
        assert classes.count(c) == round(fw.CLASS_SHARES[c] * len(profiles))
    assert st.median_cv["timer"] < 0.02  # jitter at most 1% of the period
    # Poisson: CV 1; the day's diurnal rate adds a few percent.
    assert 0.9 < st.median_cv["poisson"] < 1.15
    # Weibull shape 0.5: CV 2.24 (sample CVs of a heavy tail fall a little short).
    assert 1.8 < st.median_cv["bursty"] < 2.7
    # A timer fires once per period (the jitter's standard deviation is at most 1%
    # of it, so a gap's 1.4%; 10% is 7 standard deviations).
    timer = next(p for p in profiles if p.arrival == "timer" and p.daily_invocations > 200)
    gaps = np.diff(trace.of(timer.app, timer.func).start_s)
    assert np.allclose(gaps, fw.DAY_S / timer.daily_invocations, rtol=0.1)


def test_diurnal_peak_over_trough(day: tuple) -> None:
    _, _, st = day
    assert st.diurnal_peak_to_trough is not None
    # Target 2; the hourly profile averaged over the functions is noisy at its
    # extremes, which biases max/min upwards.
    assert 1.7 < st.diurnal_peak_to_trough < 2.5
    t = np.linspace(0, fw.DAY_S, 10_001)
    m = fw.diurnal_multiplier(t)
    assert m.max() / m.min() == pytest.approx(fw.DIURNAL_PEAK_TO_TROUGH)
    assert float(np.argmax(m)) * fw.DAY_S / 10_000 / 3600 == pytest.approx(
        fw.DIURNAL_PEAK_HOUR, abs=0.01
    )


def test_duration_and_memory_quantiles(day: tuple) -> None:
    _, trace, st = day
    # Median of per-function mean times: exp(-0.38) = 0.684 s; the 270 CPU functions'
    # sample median of a log-normal with sigma 2.36 is within exp(+-0.45) (2.5 SE).
    assert abs(math.log(st.median_duration_s) - fw.EXEC_LN_MU) < 0.45
    assert st.share_duration_under_1s == pytest.approx(
        fw._Z.cdf(-fw.EXEC_LN_MU / fw.EXEC_LN_SIGMA), abs=0.06
    )
    # Memory quantiles (Latin hypercube: within 1/270 of the targets before rounding).
    assert st.median_memory_mb == pytest.approx(fw.MEMORY_MEDIAN_MB, rel=0.03)
    assert st.share_memory_at_most_400mb == pytest.approx(0.90, abs=0.01)
    assert st.gpu_share == round(fw.GPU_SHARE * 300) / 300
    durations = np.concatenate([f.duration_s for f in trace.functions])
    assert durations.min() >= fw.EXEC_MIN_S and durations.max() <= fw.EXEC_MAX_S


def test_gpu_functions_are_servlerless_llms(day: tuple) -> None:
    profiles, trace, _ = day
    loads = llm_functions.read_model_loads(llm_functions.load_times_path())
    gpu = [p for p in profiles if p.kind == "gpu"]
    assert gpu and {p.model for p in gpu} <= set(llm_functions.MODELS)
    for p in gpu:
        measured = set(loads[p.model].service_samples_s)
        assert set(np.round(trace.of(p.app, p.func).duration_s, 3)) <= {
            round(x, 3) for x in measured
        }


def test_seed_determinism() -> None:
    a_profiles, a = fw.generate(40, 3600.0, seed=3)
    b_profiles, b = fw.generate(40, 3600.0, seed=3)
    _, c = fw.generate(40, 3600.0, seed=4)
    assert a_profiles == b_profiles
    for fa, fb in zip(a.functions, b.functions, strict=True):
        assert np.array_equal(fa.end_s, fb.end_s) and np.array_equal(fa.duration_s, fb.duration_s)
    assert a.invocations != c.invocations


@pytest.mark.parametrize("suffix", [".csv", ".csv.xz", ".csv.gz"])
def test_trace_round_trip(tmp_path: Path, suffix: str) -> None:
    profiles, trace = fw.generate(40, 1800.0, seed=11)
    path = tmp_path / f"trace{suffix}"
    rows = write_trace(trace, path)
    assert rows == trace.invocations
    back = read_trace(path, horizon_s=trace.horizon_s)
    assert back.invocations == trace.invocations
    for p in profiles:
        a, b = trace.of(p.app, p.func), back.of(p.app, p.func)
        assert np.allclose(a.end_s, b.end_s, atol=1e-9, rtol=0)
        assert np.allclose(a.duration_s, b.duration_s, atol=1e-9, rtol=0)
    again = tmp_path / f"again{suffix}"
    write_trace(back, again)
    assert again.read_bytes() == path.read_bytes()
    plain = tmp_path / "plain.csv"
    write_trace(trace, plain)
    assert plain.read_text().splitlines()[0] == "app,func,end_timestamp,duration"
    unpack = {".csv": bytes, ".csv.xz": lzma.decompress, ".csv.gz": gzip.decompress}[suffix]
    assert unpack(path.read_bytes()) == plain.read_bytes()
    write_profiles(profiles, tmp_path / "functions.csv")
    for p, q in zip(profiles, read_profiles(tmp_path / "functions.csv"), strict=True):
        assert (p.app, p.func, p.kind, p.arrival, p.model) == (
            q.app,
            q.func,
            q.kind,
            q.arrival,
            q.model,
        )
        assert q.daily_invocations == pytest.approx(p.daily_invocations, rel=1e-5)
        assert q.memory_mb == pytest.approx(p.memory_mb, rel=1e-5)


def test_reads_the_published_sample(tmp_path: Path) -> None:
    """The rows of the sample in AzureFunctionsInvocationTrace2021.md (ids cut)."""
    path = tmp_path / "sample.csv"
    path.write_text(
        "app,func,end_timestamp,duration\n"
        "734272c0,313c03f5,5160.142570018768,0.134\n"
        "17c37a0f,c9f8e30e,5161.280997037888,0.013\n"
        "7fa05b60,9bc86d6c,5241.567729949951,42.356\n"
    )
    trace = read_trace(path)
    assert trace.invocations == 3
    assert trace.horizon_s == pytest.approx(5241.567729949951)
    f = trace.of("7fa05b60", "9bc86d6c")
    assert f.start_s[0] == pytest.approx(5241.567729949951 - 42.356)


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("app,func,end,duration\na,b,1,1\n", "line 1: header lacks column end_timestamp"),
        ("", "line 1: empty file"),
        ("app,func,end_timestamp,duration\na,b,1.0,0.5\na,b,2.0,abc\n", "line 3: duration"),
        ("app,func,end_timestamp,duration\na,b,-1.0,0.5\n", "line 2: end_timestamp"),
        ("app,func,end_timestamp,duration\na,b,nan,0.5\n", "line 2: end_timestamp"),
        ("app,func,end_timestamp,duration\n,b,1.0,0.5\n", "line 2: app"),
        ("app,func,end_timestamp,duration\na,b,1.0\n", "line 2: 3 fields"),
    ],
)
def test_bad_trace_names_file_line_column(tmp_path: Path, text: str, where: str) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(SpecError) as err:
        read_trace(path)
    assert str(path) in str(err.value) and where in str(err.value)


@pytest.mark.parametrize(
    ("row", "where"),
    [
        ("a,b,tpu,poisson,1,1,100,", "line 2: kind"),
        ("a,b,cpu,weekly,1,1,100,", "line 2: arrival"),
        ("a,b,gpu,poisson,1,1,100,gpt-9", "line 2: model"),
        ("a,b,cpu,poisson,1,x,100,", "line 2: mean_duration_s"),
    ],
)
def test_bad_profiles_name_file_line_column(tmp_path: Path, row: str, where: str) -> None:
    path = tmp_path / "functions.csv"
    path.write_text(
        "app,func,kind,arrival,daily_invocations,mean_duration_s,memory_mb,model\n" + row + "\n"
    )
    with pytest.raises(SpecError) as err:
        read_profiles(path)
    assert str(path) in str(err.value) and where in str(err.value)


def test_instance_from_a_trace_solves_and_verifies(tmp_path: Path) -> None:
    profiles, trace = fw.generate(30, 3600.0, seed=5, start_hour=12.0)
    doc = fw.keepalive_instance(profiles, trace, name="small", window_s=600.0)
    spec = KeepAliveFile.model_validate(doc)
    assert len(spec.nodes) >= 1 and all(len(f.arrivals or ()) == 6 for f in spec.functions)
    # Every invocation starting inside the horizon is counted once (replicas share).
    starts = sum(int(np.sum((f.start_s >= 0) & (f.start_s < 3600.0))) for f in trace.functions)
    assert sum(sum(f.arrivals or ()) for f in spec.functions) == starts
    # Replicas keep each one within REPLICA_POWER_SHARE of a node's budget.
    for f in doc["functions"]:
        assert fw._window_power_w(f, 600.0) <= fw.REPLICA_POWER_SHARE * fw.NODE_POWER_W + 1e-9
    gpu = {fw.function_name(p) for p in profiles if p.kind == "gpu"}
    assert all(f.tepid is not None for f in spec.functions if f.name.rsplit("-r", 1)[0] in gpu)
    path = tmp_path / "small.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    plan = tmp_path / "plan.json"
    assert main(["solve", str(path), "--time-limit", "20", "-q", "-o", str(plan)]) == EXIT_OK
    assert main(["verify", str(path), str(plan)]) == EXIT_OK


def test_bundled_instance_is_its_trace(shared_data: Path) -> None:
    """instances/keepalive/functions-200.yaml holds the counts of the trace and
    profiles shipped beside it (benchmarks/make_functions.py)."""
    trace = read_trace(BUNDLED.with_name("functions-200.trace.csv.xz"), horizon_s=3600.0)
    profiles = read_profiles(BUNDLED.with_name("functions-200.functions.csv"))
    doc = yaml.safe_load(BUNDLED.read_text())
    rebuilt = fw.keepalive_instance(
        profiles, trace, name=doc["name"], window_s=doc["window_s"], description=doc["description"]
    )
    assert rebuilt == doc
    assert len(profiles) == 200
