"""Self-calibration (forecast/calibration.py): the risk's log-odds shifted by its own outcomes."""

from __future__ import annotations

import math

from kvwatch.forecast.calibration import CalibrationParams, SelfCalibration
from kvwatch.forecast.risk import RiskEstimate

MINUTE = 60.0


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
        cal.observe(t, sustained)
        if t % MINUTE == 0:
            cal.record(t, curve(risk))
        t += 10.0


def test_forecasts_that_never_come_true_lower_the_risk() -> None:
    cal = SelfCalibration(CalibrationParams(prior_sd=1.0), MINUTE)
    run(cal, 4, 0.9)
    d5, d15, d30 = cal.shifts()
    assert d5 < -0.5 and d15 < -0.5 and d30 < -0.5
    calibrated = cal.apply(curve(0.9))
    assert calibrated.at(1800) < 0.9 * math.exp(d30 + 0.05) / (1 - 0.9 + 0.9 * math.exp(d30 + 0.05))
    assert all(b >= a for a, b in zip(calibrated.risk, calibrated.risk[1:], strict=False))


def test_saturations_a_low_risk_did_not_expect_raise_it() -> None:
    cal = SelfCalibration(CalibrationParams(prior_sd=1.0), MINUTE)
    run(cal, 4, 0.05, saturated_every=1500.0)  # one every 25 minutes: most 30-minute windows hold one
    assert all(d > 0.5 for d in cal.shifts())
    assert cal.apply(curve(0.05)).at(1800) > 0.2


def test_with_little_history_the_prior_holds_the_shift_near_zero() -> None:
    cal = SelfCalibration(CalibrationParams(prior_sd=1.0), MINUTE)
    run(cal, 0.75, 0.9)  # 45 minutes: 15 scored at 30 minutes, worth half an independent outcome
    assert abs(cal.shifts()[2]) < 0.5


def test_forecasts_made_during_a_saturation_or_just_after_are_not_scored() -> None:
    # Saturated the first 20 of every 30 minutes: every forecast falls in a saturation or the 10 minutes after.
    cal = SelfCalibration(CalibrationParams(prior_sd=1.0), MINUTE)
    for k in range(4 * 360):
        t = 10.0 * k
        cal.observe(t, t % 1800 < 1200)
        if t % MINUTE == 0:
            cal.record(t, curve(0.05))
    assert cal.shifts() == (0.0, 0.0, 0.0)


def test_off_without_a_prior_and_certainties_stay() -> None:
    assert not SelfCalibration(CalibrationParams(prior_sd=0.0), MINUTE).enabled
    cal = SelfCalibration(CalibrationParams(prior_sd=1.0), MINUTE)
    run(cal, 4, 0.9)
    edges = RiskEstimate((0.0, 0.0, 1.0), 0.0, 0.0, 0.0, 0.0, MINUTE)
    assert cal.apply(edges).risk == (0.0, 0.0, 1.0)


def test_old_outcomes_leave_the_window() -> None:
    cal = SelfCalibration(CalibrationParams(prior_sd=1.0, window_seconds=3600.0), MINUTE)
    run(cal, 3, 0.9)
    lowered = cal.shifts()[0]
    # Then forecasts of 0.9 that come true (saturated throughout, but only after the first 10 minutes of each
    # half hour, so the forecasts are scored): the old misses leave, the shift comes back up.
    t0 = 3 * 3600.0
    for k in range(0, 3 * 360):
        t = t0 + 10.0 * k
        cal.observe(t, (t - t0) % 1800 >= 1500)
        if t % MINUTE == 0:
            cal.record(t, curve(0.9))
    assert cal.shifts()[0] > lowered + 1.0
