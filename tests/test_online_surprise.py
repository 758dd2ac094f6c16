"""The surprise detector (online/surprise.py): fires after the stated time out of
band and not before, keeps its cooldown, and stays quiet in band."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from energyopt.online.surprise import SurpriseConfig, SurpriseDetector


def _detector(surprise_s: float = 10.0, cooldown_s: float = 60.0) -> SurpriseDetector:
    det = SurpriseDetector(
        2, SurpriseConfig(surprise_s=surprise_s, cooldown_s=cooldown_s, noise_z=0.0)
    )
    det.set_plan([10.0, 4.0], [0.2, 0.5])  # bands: 12 and 6 req/s
    return det


def test_band_is_planned_rate_times_one_plus_quantile_plus_noise() -> None:
    det = SurpriseDetector(1, SurpriseConfig(window_s=4.0, noise_z=2.0))
    det.set_plan([9.0], [0.1], [0.3])
    low, high = det.band()
    noise = 2.0 * np.sqrt(9.0 / 4.0)
    assert high[0] == pytest.approx(9.0 * 1.1 + noise)
    assert low[0] == pytest.approx(9.0 * 0.7 - noise)


def test_fires_after_surprise_s_and_not_before() -> None:
    det = _detector(surprise_s=10.0)
    fired = {t: det.update(float(t), [13.0, 4.0]) for t in range(0, 15)}
    assert all(fired[t] == [] for t in range(0, 10))
    assert fired[10] == [0]
    assert det.fired == 1


def test_back_in_band_restarts_the_timer() -> None:
    det = _detector(surprise_s=10.0)
    for t in range(0, 9):
        assert det.update(float(t), [13.0, 4.0]) == []
    assert det.update(9.0, [11.0, 4.0]) == []  # in band: timer restarts
    for t in range(10, 20):
        assert det.update(float(t), [13.0, 4.0]) == []
    assert det.update(20.0, [13.0, 4.0]) == [0]


def test_cooldown_holds_the_next_surprise_back() -> None:
    det = _detector(surprise_s=5.0, cooldown_s=30.0)
    times = [t for t in range(0, 61) if det.update(float(t), [20.0, 4.0])]
    assert times == [5, 35]  # 5 s out of band; then not before 30 s after the first


def test_no_fire_in_band_whatever_the_time() -> None:
    det = _detector(surprise_s=1.0, cooldown_s=0.0)
    for t in range(0, 200):
        assert det.update(float(t), [12.0, 5.9]) == []
    assert det.fired == 0


def test_lower_band_only_when_given() -> None:
    det = SurpriseDetector(1, SurpriseConfig(surprise_s=2.0, noise_z=0.0))
    det.set_plan([10.0], [0.2])
    assert [det.update(float(t), [1.0]) for t in range(5)] == [[]] * 5
    det.set_plan([10.0], [0.2], [0.5])
    assert [t for t in range(5) if det.update(float(t), [1.0])] == [2]


def test_a_new_plan_restarts_the_timers() -> None:
    det = _detector(surprise_s=10.0)
    for t in range(0, 9):
        det.update(float(t), [13.0, 4.0])
    det.set_plan([10.0, 4.0], [0.2, 0.5])
    assert det.update(9.0, [13.0, 4.0]) == []  # out of band from 9 s now
    assert det.update(19.0, [13.0, 4.0]) == [0]


def test_bad_input_names_the_field() -> None:
    with pytest.raises(ValueError, match="window_s"):
        SurpriseConfig(window_s=0.0)
    with pytest.raises(ValueError, match="surprise_s"):
        SurpriseConfig(surprise_s=-1.0)
    det = SurpriseDetector(2)
    with pytest.raises(ValueError, match="upper"):
        det.set_plan([1.0, 2.0], [0.1])
    with pytest.raises(ValueError, match="observed_rps"):
        det.update(0.0, [1.0, float("nan")])


@settings(max_examples=60, deadline=None)
@given(
    surprise_s=st.floats(0.5, 30.0),
    cooldown_s=st.floats(0.0, 100.0),
    step_s=st.floats(0.1, 5.0),
    outs=st.lists(st.booleans(), min_size=1, max_size=120),
)
def test_fires_exactly_when_out_long_enough_and_cooled_down(
    surprise_s: float, cooldown_s: float, step_s: float, outs: list[bool]
) -> None:
    """Against a plain replay of the rule: a surprise at t iff out of band since some
    t0 (every update from t0 to t out of band, none since the last surprise) with
    t - t0 >= surprise_s, and t - last surprise >= cooldown_s."""
    det = SurpriseDetector(1, SurpriseConfig(surprise_s=surprise_s, cooldown_s=cooldown_s))
    det.set_plan([5.0], [0.0])
    since: float | None = None
    last = -np.inf
    for k, out in enumerate(outs):
        t = k * step_s
        fired = det.update(t, [100.0 if out else 0.0])
        if not out:
            since = None
            assert fired == []
            continue
        if since is None:
            since = t
        expect = t - since >= surprise_s - 1e-9 and t - last >= cooldown_s - 1e-9
        assert fired == ([0] if expect else [])
        if expect:
            last = t
            since = None
