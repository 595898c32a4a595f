"""The saturation risk's shot-noise dynamics (kvwatch.forecast.risk): conditioned on the newest minute,
relaxing with the measured correlation time, crossings rarer when bursts are slow."""

from __future__ import annotations

import math

from kvwatch.forecast.demand import DemandEstimate
from kvwatch.forecast.risk import RiskParams, _ou_risk, correlation_seconds

CAPACITY = 100_000.0


def flat_demand() -> DemandEstimate:
    return DemandEstimate(capacity_tokens=CAPACITY, token_seconds_per_request=1000.0, rate_level=50.0,
                          rate_slope=0.0, rate_slope_lower=0.0, burst_factor=1.0, tokens_per_running_request=None,
                          damping=0.97, bucket_seconds=60.0, u_sat=0.95, eta_seconds=math.inf)


def risk(newest: float, *, mean: float = 60_000.0, size: float = 1_500.0, rho: float = 0.0,
         residence: float = 60.0) -> tuple[float, float, float]:
    estimate = _ou_risk(RiskParams(), flat_demand(), 0.9 * CAPACITY, size, mean, newest, residence, rho)
    return estimate.at(300), estimate.at(900), estimate.at(1800)


def test_the_risk_starts_from_the_newest_minute_not_the_stationary_law():
    far = risk(40_000.0, rho=0.8)
    near = risk(85_000.0, rho=0.8)
    assert near[0] > 10 * far[0]  # five minutes ahead, where the cache is now matters
    # Further ahead the start is forgotten (several correlation times): the two risks draw together.
    assert near[2] / far[2] < near[0] / far[0] / 10


def test_slow_bursts_cross_less_often_than_fast_ones():
    fast = risk(60_000.0, rho=0.0)
    slow = risk(60_000.0, rho=0.9)
    assert slow[2] < 0.6 * fast[2]


def test_the_risk_is_a_monotone_probability_in_the_horizon():
    r5, r15, r30 = risk(70_000.0)
    assert 0.0 <= r5 <= r15 <= r30 <= 1.0


def test_correlation_time_is_at_least_the_residence_and_at_most_the_window():
    assert correlation_seconds(90.0, 0.0, 60.0, 30) == 90.0
    assert math.isclose(correlation_seconds(10.0, math.exp(-1.0), 60.0, 30), 60.0)
    assert correlation_seconds(10.0, 0.9999, 60.0, 30) == 1800.0
