"""Pure parts of the backtest: ground-truth events, warning episodes, matching, baselines."""

from __future__ import annotations

import pytest

from kvwatch.backtest.baselines import ForDuration, HoltBaseline, LinearFit, PredictLinearBaseline, ThresholdBaseline
from kvwatch.backtest.scoring import (
    QUIET_SECONDS,
    WARMUP_SECONDS,
    Episode,
    Event,
    active_before_onsets,
    detection_delays,
    find_episodes,
    find_events,
    mask_warmup,
    pool,
    saturated_samples,
    score_run,
    summarize,
    warmup_windows,
)

TIMES = [10.0 * i for i in range(1, 721)]  # two hours of 10-s polls


def test_saturated_samples_follow_the_three_rules():
    usage = [0.96, 0.91, 0.91, 0.5, 0.5]
    waiting = [0, 1, 0, 0, 0]
    preempted = [0, 0, 0, 0, 3]
    assert saturated_samples(usage, waiting, preempted) == [True, True, False, False, True]


def test_an_event_needs_a_sustained_run_and_close_events_merge():
    sat = [False] * len(TIMES)
    for i in range(300, 330):  # 5 minutes saturated from t=3010
        sat[i] = True
    sat[100] = sat[101] = True  # a 20-second blip is not an event
    for i in range(360, 380):  # again after a 5-minute gap: merged into the first event
        sat[i] = True
    events = find_events(TIMES, sat)
    assert events == [Event(onset=3010.0, end=3800.0)]


def test_episodes_are_contiguous_runs():
    active = [False, True, True, False, True]
    assert find_episodes([1, 2, 3, 4, 5], active) == [Episode(2, 3), Episode(5, 5)]


def test_matching_leads_false_alarms_and_late_episodes():
    events = [Event(5000.0, 6000.0), Event(20000.0, 21000.0)]
    episodes = [
        Episode(3800.0, 6500.0),  # 20 minutes before the first event: lead 1200 s
        Episode(5500.0, 5600.0),  # starts during the first event: late, not scored for precision
        Episode(9000.0, 9100.0),  # nothing follows within an hour: false alarm
    ]
    outcome = score_run(events, episodes, monitored_seconds=86400.0)
    assert outcome.leads == [1200.0, None]
    assert (outcome.true_positive_episodes, outcome.false_alarm_episodes, outcome.late_episodes) == (1, 1, 1)
    summary = summarize(outcome)
    assert summary["recall"] == {"0": 0.5, "300": 0.5, "900": 0.5, "1800": 0.0}
    assert summary["median_lead_seconds"] == 1200.0
    assert summary["precision"] == 0.5
    assert summary["false_alarms_per_day"] == 1.0


def test_an_episode_more_than_an_hour_early_is_not_a_lead():
    outcome = score_run([Event(10000.0, 11000.0)], [Episode(5000.0, 5100.0)], monitored_seconds=43200.0)
    assert outcome.leads == [None]
    assert outcome.false_alarm_episodes == 1


def test_detection_delay_of_the_reactive_alert():
    events = [Event(100.0, 400.0)]
    firing = [t >= 210.0 for t in TIMES[:60]]
    assert detection_delays(events, TIMES[:60], firing) == [110.0]


def test_for_duration_resets_on_a_false_evaluation():
    f = ForDuration(30.0)
    assert [f.update(t, c) for t, c in [(0, True), (20, True), (30, True), (40, False), (50, True)]] == [
        False, False, True, False, False]


def test_linear_fit_matches_least_squares_and_predicts_from_eval_time():
    fit = LinearFit(window_seconds=1800.0)
    for t in range(0, 1800, 10):
        fit.add(float(t), 0.2 + 0.0001 * t + (0.01 if t % 20 else -0.01))
    # Slope 1e-4 per second: 1800 s after t=1790 the line is at 0.2 + 1e-4 * 3590.
    assert fit.predict(1790.0, 1800.0) == pytest.approx(0.2 + 0.0001 * 3590, abs=2e-3)


def test_linear_fit_window_is_left_open_and_drops_old_points():
    fit = LinearFit(window_seconds=60.0)
    for t in range(0, 300, 10):
        fit.add(float(t), 1.0 if t < 200 else 0.0)
    assert fit.predict(290.0, 0.0) == pytest.approx(0.0, abs=1e-9)  # only flat zeros remain


def test_baselines_fire_on_their_rules():
    threshold = ThresholdBaseline(0.95, for_seconds=60.0)
    assert not any(threshold.observe(t, 0.96) for t in (0.0, 30.0))
    assert threshold.observe(60.0, 0.96)
    rising = PredictLinearBaseline(1800.0, 1800.0, 0.95)
    fired = [rising.observe(float(t), 0.3 + 0.0003 * t) for t in range(0, 1200, 10)]
    assert fired[-1] and not fired[0]
    guarded = PredictLinearBaseline(1800.0, 1800.0, 1.0, level_floor=0.7, for_seconds=300.0)
    assert not any(guarded.observe(float(t), 0.3 + 0.0003 * t) for t in range(0, 1200, 10))  # under the floor


def test_holt_extrapolates_per_minute_means():
    holt = HoltBaseline(horizon_minutes=30.0, threshold=0.95, for_seconds=0.0)
    states = [holt.observe(float(t), 0.4 + 0.01 * (t // 60)) for t in range(0, 40 * 60, 10)]
    assert not states[0] and states[-1]  # 1 %/min from ~0.78: 30 min ahead exceeds 0.95
    flat = HoltBaseline(for_seconds=0.0)
    assert not any(flat.observe(float(t), 0.8) for t in range(0, 3600, 10))


def test_warmup_is_the_same_for_every_method_and_its_events_are_scored_apart():
    times = [float(t) for t in range(0, 7200, 10)]
    windows = warmup_windows((), 7200.0)
    assert windows == [(0.0, WARMUP_SECONDS)]
    # A "warning" raised in the first minute of data and held on: masked until the warm-up ends.
    active = mask_warmup(times, [True] * len(times), windows)
    assert not any(a for t, a in zip(times, active, strict=True) if t < WARMUP_SECONDS)
    episodes = find_episodes(times, active)
    assert episodes[0].start == WARMUP_SECONDS
    events = [Event(540.0, 900.0), Event(3000.0, 3200.0)]  # the first starts inside the warm-up
    outcome = score_run(events, episodes, monitored_seconds=7200.0, warmup=windows)
    assert outcome.warmup_events == 1
    assert outcome.leads == [3000.0 - WARMUP_SECONDS]  # the 540-s event is not credited with a 9-minute lead
    assert outcome.monitored_seconds == 7200.0 - WARMUP_SECONDS


def test_restarts_open_another_warmup():
    assert warmup_windows((5000.0,), 6000.0) == [(0.0, WARMUP_SECONDS), (5000.0, 6000.0)]


def test_false_alarms_per_day_need_a_monitored_day():
    short = score_run([], [Episode(9000.0, 9100.0)], monitored_seconds=7200.0)
    summary = summarize(short)
    assert summary["false_alarms_per_day"] is None  # never extrapolated from 2 h
    assert summary["false_alarms"] == 1
    pooled = pool([short] * 12)  # 24 monitored hours
    assert summarize(pooled)["false_alarms_per_day"] == 12.0


def test_an_event_needs_the_quiet_gap_before_it():
    times = [float(t) for t in range(0, 3600, 10)]
    saturated = [300 <= t < 600 or 600 + QUIET_SECONDS - 100 <= t < 1500 or 2400 <= t < 2700 for t in times]
    events = find_events(times, saturated)
    # The second stretch starts less than N after the first ended: same event; the third is a new one.
    assert [e.onset for e in events] == [300.0, 2400.0]


def test_a_warning_on_long_before_an_event_counts_as_active_before_it():
    times = [float(t) for t in range(0, 14400, 10)]
    active = [t >= 2000 for t in times]  # on from 2000 s, more than an hour before the onset at 9000 s
    events = [Event(9000.0, 9500.0), Event(1000.0, 1200.0)]  # the second starts inside the warm-up
    assert active_before_onsets(events, times, active, warmup_windows((), 14400.0)) == [True]
    assert score_run(events[:1], find_episodes(times, active), monitored_seconds=14400.0).leads == [None]
    assert active_before_onsets([Event(2100.0, 2200.0)], times, active) == [False]  # on for only 100 s


def test_calibration_skips_the_quiet_gap_after_an_event_where_no_new_event_can_begin():
    from kvwatch.backtest.scoring import score_probabilities

    events = [Event(1000.0, 1500.0)]
    times = [float(t) for t in range(0, 4000, 60)]
    certain = [1.0] * len(times)
    new_rule = score_probabilities(times, certain, 300.0, events, end=4000.0)
    old_rule = score_probabilities(times, certain, 300.0, events, end=4000.0, quiet_after=0.0)
    # Minutes in (1500, 1500 + QUIET] are scored under the old rule only, each with outcome 0 by construction.
    gap = [t for t in times if 1500.0 < t <= 1500.0 + QUIET_SECONDS and t + 300.0 <= 4000.0]
    assert old_rule.n - new_rule.n == len(gap) > 0
    assert old_rule.outcomes == new_rule.outcomes


def test_a_lead_needs_an_early_warning_still_on_at_the_onset():
    # A warning that ended before the onset told the operator "all clear"; one raised during an earlier
    # saturation is a reaction to it. Neither leads the next event (before 2026-12-04 both did, and a
    # 1-minute usage threshold earned recall at 30 minutes).
    events = [Event(5400.0, 6400.0), Event(7400.0, 8200.0), Event(9300.0, 10800.0)]
    episodes = [
        Episode(5500.0, 8000.0),  # raised during event 1, still on at event 2: a reaction, not a lead
        Episode(8500.0, 8900.0),  # ended 400 s before event 3: no lead
        Episode(9000.0, 9250.0),  # off 50 s before event 3's onset: within the grace, leads it by 300 s
    ]
    outcome = score_run(events, episodes, monitored_seconds=86400.0)
    assert outcome.leads == [None, None, 300.0]
    assert score_run(events[2:], [Episode(9000.0, 9200.0)], monitored_seconds=86400.0).leads == [None]
