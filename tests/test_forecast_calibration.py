"""Self-calibration (forecast/calibration.py): the risk's log-odds shifted by its own outcomes."""

from __future__ import annotations

import math

import pytest

from kvwatch.forecast.calibration import CalibrationParams, SelfCalibration
from kvwatch.forecast.risk import RiskEstimate

MINUTE = 60.0


def calibration(prior_sd: float = 1.0, **params: float) -> SelfCalibration:
    return SelfCalibration(CalibrationParams(prior_sd=prior_sd, **params), MINUTE, event_window_seconds=120.0,
                           max_gap_seconds=30.0)


def curve(risk: float, minutes: int = 60) -> RiskEstimate:
    """A risk curve rising to ``risk`` at 30 minutes and flat beyond (cumulative)."""
    values = tuple(risk * min(1.0, m / 30) for m in range(1, minutes + 1))
    return RiskEstimate(values, 0.0, 0.0, 0.0, 0.0, MINUTE)


def run(cal: SelfCalibration, hours: float, risk: float, saturated_every: float | None = None,
        saturated_for: float = 180.0) -> None:
    """Polls every 10 s, a forecast each minute; sustained saturation for ``saturated_for`` s every
    ``saturated_every`` s (None: never)."""
    t = 0.0
    while t < hours * 3600:
        sustained = saturated_every is not None and t % saturated_every >= saturated_every - saturated_for
        cal.observe(t, sustained, sustained)
        if t % MINUTE == 0:
            cal.record(t, curve(risk))
        t += 10.0


def test_forecasts_that_never_come_true_lower_the_risk() -> None:
    cal = calibration()
    run(cal, 4, 0.9)
    d5, d15, d30 = cal.shifts()
    assert d5 < -0.5 and d15 < -0.5 and d30 < -0.5
    calibrated = cal.apply(curve(0.9))
    assert calibrated.at(1800) < 0.9 * math.exp(d30 + 0.05) / (1 - 0.9 + 0.9 * math.exp(d30 + 0.05))
    assert all(b >= a for a, b in zip(calibrated.risk, calibrated.risk[1:], strict=False))


def test_saturations_a_low_risk_did_not_expect_raise_it() -> None:
    cal = calibration()
    run(cal, 4, 0.05, saturated_every=1500.0)  # one every 25 minutes: most 30-minute windows hold one
    assert all(d > 0.5 for d in cal.shifts())
    assert cal.apply(curve(0.05)).at(1800) > 0.2


def test_with_little_history_the_prior_holds_the_shift_near_zero() -> None:
    cal = calibration()
    run(cal, 0.75, 0.9)  # 45 minutes: 15 scored at 30 minutes, worth half an independent outcome
    assert abs(cal.shifts()[2]) < 0.5


def test_forecasts_made_during_a_saturation_or_just_after_are_not_scored() -> None:
    # Saturated the first 20 of every 30 minutes: every forecast falls in a saturation or the 10 minutes after.
    cal = calibration()
    for k in range(4 * 360):
        t = 10.0 * k
        cal.observe(t, t % 1800 < 1200, t % 1800 < 1200)
        if t % MINUTE == 0:
            cal.record(t, curve(0.05))
    assert cal.shifts() == (0.0, 0.0, 0.0)


def test_off_without_a_prior_and_certainties_stay() -> None:
    assert not calibration(prior_sd=0.0).enabled
    cal = calibration()
    run(cal, 4, 0.9)
    edges = RiskEstimate((0.0, 0.0, 1.0), 0.0, 0.0, 0.0, 0.0, MINUTE)
    assert cal.apply(edges).risk == (0.0, 0.0, 1.0)


def test_old_outcomes_leave_the_window() -> None:
    cal = calibration(window_seconds=3600.0)
    run(cal, 3, 0.9)
    lowered = cal.shifts()[0]
    # Then forecasts of 0.9 that come true (saturated throughout, but only after the first 10 minutes of each
    # half hour, so the forecasts are scored): the old misses leave, the shift comes back up.
    t0 = 3 * 3600.0
    for k in range(0, 3 * 360):
        t = t0 + 10.0 * k
        cal.observe(t, (t - t0) % 1800 >= 1500, (t - t0) % 1800 >= 1500)
        if t % MINUTE == 0:
            cal.record(t, curve(0.9))
    assert cal.shifts()[0] > lowered + 1.0


def _outcomes(cal: SelfCalibration, horizon_index: int = 0) -> tuple[int, int]:
    h = cal._horizons[horizon_index]
    return sum(h.hits), sum(h.misses)


def test_a_saturation_starts_at_the_first_saturated_poll_of_the_window_that_made_it_sustained() -> None:
    # Saturated from 3600 s; the detector reads it sustained from 3700 s (80 % of 2 minutes). As the scorer dates
    # the event, a forecast made at 3600 is made during it (not scored), and one made at 3300 for 5 minutes ahead
    # (to 3600) came true.
    cal = calibration()
    for k in range(int(5400 / 10)):
        t = 10.0 * k
        cal.observe(t, t >= 3600, t >= 3700)
        if t % MINUTE == 0:
            cal.record(t, curve(0.5))
    assert cal._saturations[0][0] == 3600.0
    hits, misses = _outcomes(cal)
    # 5-minute forecasts made at 0..3240 missed (55), at 3300..3540 came true (5: the saturation is in progress at
    # their horizon's end or before it); from 3600 on they are made during it.
    assert (hits, misses) == (5, 55)


def test_forecasts_whose_horizon_a_gap_hides_are_not_scored() -> None:
    # Polls stop at 3600 s for 40 minutes, while the engine (unseen) saturates: the forecasts made in the half hour
    # before the gap cannot be scored, and no forecast that would have seen the gap's saturation is scored as a miss.
    cal = calibration()
    times = [10.0 * k for k in range(361)] + [6000.0 + 10.0 * k for k in range(180)]
    for t in times:
        cal.observe(t, False, False)
        if t % MINUTE == 0:
            cal.record(t, curve(0.5))
    horizon = cal._horizons[2]  # 30 minutes: scored entries are (made + 30 min, bin, came true)
    last_made = max(end for end, _, _ in horizon.scored) - 1800.0
    assert last_made < 3600.0 - 1800.0


@pytest.mark.parametrize(("days", "every", "lasting", "warm_until"), [
    (7, 3600, 300, 0),  # no risk at all (no demand model): record never runs
    (3, 900, 200, 3600),  # warm for an hour, then never again (a restart loop): the pending forecasts go unscored
])
def test_saturations_are_forgotten_while_no_forecast_is_scored(days: int, every: int, lasting: int,
                                                               warm_until: int) -> None:
    cal = calibration()
    for k in range(days * 24 * 360):
        t = 10.0 * k
        on = t % every < lasting
        cal.observe(t, on, on)
        if t < warm_until and t % MINUTE == 0:
            cal.record(t, curve(0.5))
    assert len(cal._saturations) <= 2
