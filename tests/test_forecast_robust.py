"""Estimators: Theil–Sen with Sen's bounds, EWMA, damped trend, per-minute buckets with resets."""

from __future__ import annotations

import math
import random
import statistics

import pytest

from kvwatch.counters import counter_delta, histogram_delta
from kvwatch.forecast.buckets import BucketAggregator, SampleDeltas
from kvwatch.forecast.robust import (
    Ewma,
    SlidingTheilSen,
    damped_trend_offset,
    least_squares,
    level_shift,
    quantile,
    theil_sen,
)


def test_theil_sen_recovers_a_line_and_ignores_outliers():
    xs = [float(i) for i in range(30)]
    ys = [0.5 + 0.01 * x for x in xs]
    for i in (3, 11, 19, 25):  # 4 of 30 points are wild bursts
        ys[i] = 1.0
    fit = theil_sen(xs, ys)
    assert fit is not None
    assert fit.slope == pytest.approx(0.01, abs=1e-3)
    assert fit.lower <= fit.slope <= fit.upper
    assert fit.significantly_positive


def test_theil_sen_lower_bound_rarely_positive_on_flat_noise():
    # An 80 % two-sided interval puts its lower bound above 0 for ~10 % of flat noisy series.
    xs = [float(i) for i in range(30)]
    positives = 0
    for seed in range(200):
        rng = random.Random(seed)
        fit = theil_sen(xs, [0.7 + rng.gauss(0, 0.05) for _ in xs], confidence=0.8)
        positives += fit.significantly_positive
    assert 0.03 <= positives / 200 <= 0.2


def test_theil_sen_wider_confidence_gives_wider_bounds():
    rng = random.Random(1)
    xs = [float(i) for i in range(40)]
    ys = [0.01 * x + rng.gauss(0, 0.05) for x in xs]
    narrow, wide = theil_sen(xs, ys, 0.5), theil_sen(xs, ys, 0.95)
    assert wide.lower < narrow.lower and wide.upper > narrow.upper


def test_theil_sen_needs_three_points_and_equal_lengths():
    assert theil_sen([0.0, 1.0], [0.0, 1.0]) is None
    with pytest.raises(ValueError):
        theil_sen([0.0, 1.0, 2.0], [0.0, 1.0])


def test_sawtooth_has_no_trend_under_theil_sen():
    # A sawtooth sampled over whole periods: robust slope ~0 (least squares would depend on the phase).
    xs = [float(i) for i in range(30)]
    ys = [0.5 + 0.4 * ((i % 5) / 4) for i in range(30)]
    fit = theil_sen(xs, ys)
    assert abs(fit.slope) < 0.01
    assert not fit.significantly_positive


def test_ewma_halflife_and_seed():
    e = Ewma(halflife_steps=1.0)
    assert e.update(10.0) == 10.0  # the first value seeds it
    assert e.update(0.0) == pytest.approx(5.0)  # one half-life: half way


def test_damped_trend_offset_saturates():
    assert damped_trend_offset(1.0, 1.0, 10) == 10
    assert damped_trend_offset(1.0, 0.97, 10) < 10
    limit = 0.97 / 0.03
    assert damped_trend_offset(1.0, 0.97, 10_000) == pytest.approx(limit, rel=1e-6)
    assert damped_trend_offset(1.0, 0.97, 0) == 0.0


def test_quantile_interpolates():
    assert quantile([1, 2, 3, 4, 5], 0.5) == 3
    assert quantile([0, 10], 0.9) == pytest.approx(9.0)


def test_counter_delta_treats_a_decrease_as_a_reset():
    assert counter_delta(10, 15) == 5
    assert counter_delta(100, 7) == 7
    assert counter_delta(None, 7) is None


def test_histogram_delta_resets_every_bucket_together():
    assert histogram_delta((5.0, 10.0, 12.0), (6.0, 13.0, 16.0)) == (1.0, 3.0, 4.0)
    # A restart: the total went down, so every bucket counts from zero, even one that did not go down (5 -> 6).
    assert histogram_delta((5.0, 10.0, 12.0), (6.0, 6.0, 7.0)) == (6.0, 6.0, 7.0)
    assert histogram_delta((5.0, 10.0, 12.0), (4.0, 11.0, 13.0)) == (4.0, 11.0, 13.0)  # a bucket went down: reset
    assert histogram_delta((5.0, 10.0), (1.0, 2.0, 3.0)) is None  # other bounds
    assert histogram_delta(None, (1.0,)) is None


def _deltas(seconds=10.0, finished=2.0, queue_change=0.0):
    return SampleDeltas(seconds, finished, queue_change, 0.0, 100.0, 50.0, 200.0, 2.0, 100.0, 2.0)


def test_buckets_close_per_minute_with_rates_over_covered_time():
    agg = BucketAggregator(60.0)
    closed = [agg.add(t, 0.1 * (t // 10 % 6), 1000.0, 4.0, 0.0, _deltas()) for t in range(0, 60, 10)]
    assert closed == [None] * 6
    bucket = agg.add(60.0, 0.5, 1000.0, 4.0, 1.0, _deltas(queue_change=3.0))
    assert bucket is not None and bucket.minute == 0 and bucket.samples == 6
    assert bucket.u_max == pytest.approx(0.5)
    assert bucket.u_mean == pytest.approx(0.25)
    assert bucket.u_sd == pytest.approx(statistics.stdev([0.0, 0.1, 0.2, 0.3, 0.4, 0.5]))  # the polls' spread
    assert bucket.departure_rate == pytest.approx(0.2)  # 12 finished over 60 s
    assert bucket.k_mean == pytest.approx(250.0)
    assert bucket.request_prompt_count == 12


def test_bucket_without_counter_deltas_has_no_rates():
    agg = BucketAggregator(60.0)
    agg.add(0.0, 0.5, None, 1.0, 0.0, None)
    bucket = agg.add(60.0, 0.5, None, 1.0, 0.0, None)
    assert bucket.departure_rate is None and bucket.arrival_rate is None and bucket.k_mean is None
    assert math.isclose(bucket.u_p90, 0.5)
    assert bucket.u_sd == 0.0  # one poll has no spread


def test_length_bucket_deltas_per_minute_and_across_a_reset():
    from kvwatch.forecast import Forecaster, ForecastSample

    bounds = (100.0, 1000.0, math.inf)

    def sample(t: float, cumulative: tuple[float, ...], count: float) -> ForecastSample:
        return ForecastSample(timestamp=t, kv_usage=0.5, capacity_tokens=1000.0, finished_total=count,
                              request_prompt_tokens_count=count, prompt_length_bounds=bounds,
                              prompt_length_cumulative=cumulative, generation_length_bounds=bounds,
                              generation_length_cumulative=cumulative)

    f = Forecaster()
    # Minute 0: 3 requests (2 short, 1 long); minute 1: the engine restarts at 70 s (every count goes down)
    # and finishes 1 short request after that; minute 2 closes minute 1.
    polls = [(0.0, (10.0, 12.0, 12.0)), (20.0, (11.0, 13.0, 13.0)), (40.0, (12.0, 14.0, 15.0)),
             (60.0, (12.0, 14.0, 15.0)), (70.0, (0.0, 0.0, 0.0)), (90.0, (1.0, 1.0, 1.0)), (120.0, (1.0, 1.0, 1.0))]
    for t, cumulative in polls:
        f.observe(sample(t, cumulative, cumulative[-1]))
    minutes = list(f._buckets)  # the closed minutes (private: what risk.py reads)
    assert [m.minute for m in minutes] == [1]  # the restart dropped minute 0 with the rest of the state
    assert tuple(minutes[0].prompt_length_counts) == (1.0, 1.0, 1.0)  # not 1 - 12 per bucket, nor the pre-reset counts
    assert minutes[0].generation_length_bounds == bounds


def test_length_buckets_read_once_a_minute_still_sum_per_minute():
    # kvwatch serve reads the buckets only on its edge polls (once a minute): the delta since the last poll that
    # read them goes to the minute of the poll that read them.
    from kvwatch.forecast import Forecaster, ForecastSample

    bounds = (100.0, math.inf)
    f = Forecaster()
    for i in range(19):
        t = 10.0 * i
        edge = i % 6 == 5  # t = 50, 110, 170
        cumulative = (float(i), 2.0 * i) if edge else None
        f.observe(ForecastSample(timestamp=t, kv_usage=0.5, capacity_tokens=1000.0, finished_total=2.0 * i,
                                 prompt_length_bounds=bounds if edge else None, prompt_length_cumulative=cumulative,
                                 generation_length_bounds=bounds if edge else None,
                                 generation_length_cumulative=cumulative))
    minutes = list(f._buckets)
    assert [m.minute for m in minutes] == [0, 1, 2]
    assert minutes[0].prompt_length_counts is None  # the first read has nothing to subtract
    assert tuple(minutes[1].prompt_length_counts) == (6.0, 12.0)  # t = 110 minus t = 50
    assert tuple(minutes[2].generation_length_counts) == (6.0, 12.0)  # t = 170 minus t = 110


def _fits_equal(a: object, b: object) -> bool:
    return a == b or (a is not None and b is not None and str(a) == str(b))  # str: NaN fields compare unequal


def test_sliding_theil_sen_equals_a_fresh_fit_on_every_call():
    """Windows sliding by 0-3 points, with gaps in x, duplicated x, restarts, jumps, NaN and infinite points:
    every fit equals theil_sen's on the same points, and most calls reuse the kept slopes (else it is no use)."""
    rng = random.Random(7)
    sliding = SlidingTheilSen()
    reused = 0
    xs: list[float] = []
    ys: list[float] = []
    calls = 4000
    for _ in range(calls):
        roll = rng.random()
        if roll < 0.02:  # a restart: fresh points
            xs, ys = [], []
        elif roll < 0.04:  # a jump: most points gone
            xs, ys = xs[len(xs) * 3 // 4:], ys[len(ys) * 3 // 4:]
        for _ in range(rng.choice((0, 1, 1, 1, 2, 3))):
            x = (xs[-1] if xs else 0.0) + rng.choice((0.0, 1.0, 1.0, 1.0, 2.0, 5.0))
            y = rng.choice((math.nan, math.inf, -math.inf)) if rng.random() < 0.01 else rng.gauss(0.5, 0.2)
            xs.append(x)
            ys.append(round(y, 2) if rng.random() < 0.3 else y)  # ties
        while len(xs) > 45 or (xs and xs[0] <= xs[-1] - 60):
            xs, ys = xs[1:], ys[1:]
        kept_before = sliding._slopes is not None and bool(xs) and xs[0] in sliding._xs
        assert _fits_equal(sliding.fit(xs, ys, 0.9), theil_sen(xs, ys, 0.9)), (xs, ys)
        reused += kept_before
    assert reused > calls // 2


def test_sliding_theil_sen_checks_lengths_like_theil_sen():
    with pytest.raises(ValueError):
        SlidingTheilSen().fit([0.0, 1.0, 2.0], [0.0, 1.0])
    assert SlidingTheilSen().fit([0.0, 1.0], [0.0, 1.0]) is None


def _line_squares(ys: list[float]) -> float:
    return sum(e * e for e in least_squares([(float(i), y) for i, y in enumerate(ys)])[4])


def test_a_shift_of_level_is_found_where_it_beats_the_line():
    rng = random.Random(4)
    step = [(40.0 if i < 18 else 80.0) + rng.gauss(0.0, 1.0) for i in range(30)]
    found = level_shift(step, _line_squares(step), 2.0, 5)
    assert found is not None and found[0] == 18 and found[1] == pytest.approx(80.0, abs=1.0)
    # A ramp, and flat noise, are explained by the line (or nothing) about as well: no shift.
    ramp = [40.0 + i + rng.gauss(0.0, 1.0) for i in range(30)]
    flat = [60.0 + rng.gauss(0.0, 3.0) for _ in range(30)]
    assert level_shift(ramp, _line_squares(ramp), 2.0, 5) is None
    assert level_shift(flat, _line_squares(flat), 2.0, 5) is None
    # min_segment points after the break: a step in the last 3 points is not judged yet; ratio 0 is off.
    late = [40.0] * 27 + [80.0] * 3
    assert level_shift(late, _line_squares(late), 2.0, 5) is None
    assert level_shift(step, _line_squares(step), 0.0, 5) is None
    # Flat to within rounding: no shift (sums of squares of the raw values found one at k=7 in 30 × 0.1).
    for value in (0.1, 3_000_000.1):
        assert level_shift([value] * 30, _line_squares([value] * 30), 3.0, 5) is None

