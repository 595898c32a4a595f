"""Saturation risk: P(KV occupancy reaches capacity within h), from an M/G/∞ shot-noise model.

KV tokens in use are a sum over requests in flight, each holding ``S`` tokens for ``D`` seconds. With
Poisson arrivals at rate ``λ`` the occupancy has mean ``λ·E[S·D]`` and variance ``λ·E[S²·D]`` (Campbell's
theorem). What a sidecar can see gives both without per-request data:

- mean: ``λ·A`` with ``A = E[S·D]`` the measured token-seconds per request (Little's law, demand.py);
- variance: ``s·mean`` with ``s = E[S²·D]/E[S·D]``, the footprint-weighted request size. ``s`` is the index
  of dispersion of the per-minute mean occupancy (variance over mean, around a straight line through the
  window so a ramp is not mistaken for noise). Its floor is what Poisson arrivals alone would give: the
  mean KV footprint of finished requests from the length histograms (``E[P] + E[G]``) times the averaging
  factor of a one-minute mean, ``2x(1 − x(1 − e^(−1/x)))`` with ``x = τ / 60 s`` (so a quiet window does
  not claim tiny requests, and long-lived long-context requests count fully).
- level: a least-squares line through the last 30 per-minute means, read at the newest minute: it follows
  a ramp (``λ·A`` from demand.py lags one by its smoothing) without chasing a 5-minute burst, whose size
  the variance already describes (the mean of the last 5 minutes as the level was tried: steady load then
  swung the risk from 0 to 0.7 and back every burst). v6 shrinks the line's slope by the share of it that is
  signal, ``max(0, 1 − 1/t²)``: on a steady load the slope of 30 noisy minute means is mostly noise, and
  read 14.5 minutes past the window's centre it lifted the level (``RiskParams.level_shrink``).

The rate is projected with the damped robust trend of demand.py (and its knee: requests hold KV longer
as the batch grows), which moves both moments: mean and variance grow with ``λ̂(t)``. The probability of
reaching the threshold ``c`` by ``h`` uses the rate of excursions above ``c``: Rice's formula
``ν = (σ'/2πσ)·exp(−z²/2)`` with the occupancy's own time scale, the mean residence ``τ`` of a request
(the e2e latency histogram's sum/count; Little's ``running/λ`` without it): ``ν(t) = k·σ_t·f_t(c)/τ``,
with ``f_t`` the occupancy density (``σ·f(c) = φ(z)`` for a Gaussian) and ``k`` a tuned constant.
(The gross token inflow as the upward speed was tried first: it counts every jitter of a busy cache as a
crossing and was 40× too eager.) A saturation event is *sustained* saturation (most of a 2-minute
window, backtest/scoring.py): a cache whose requests live seconds touches any level for an instant many
times without saturating, so the moments are those of the per-minute mean occupancy (its measured
dispersion includes the minute-scale bursts of real traffic, which an ideal Poisson model would miss), and
excursions last about ``τ + W`` with ``W = sustain_seconds``. The polls inside a minute
spread around its mean, so a minute saturates some polls once its mean is within a few within-minute
standard deviations of the threshold: ``c = 0.95·C − k·σ_within`` (``σ_within`` measured from the polls;
``k`` tuned). Then ``risk(h) = 1 − (1 − max_t P(K̄_t ≥ c))·exp(−∫₀ʰ ν)``. ``f_t`` is
Gaussian or moment-matched gamma (the shot noise is right-skewed); docs/forecasting.md has the measured
comparison.

That is v2 (``dynamics="stationary"``). The default (``"ou"``, ``_ou_risk``) conditions on now: the
occupancy is shot noise with a memory, so the minute mean starts at the newest minute and relaxes to the
projected mean with correlation time ``θ`` (at least ``τ``, longer when consecutive minute means are
measured to correlate), and crossings come at the rate of a process with that correlation: a cache far
below ``c`` cannot get there in five minutes, and slow bursts cross rarely however wide they are.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from operator import add

from kvwatch.forecast.buckets import MinuteBucket
from kvwatch.forecast.demand import DemandEstimate
from kvwatch.forecast.robust import least_squares, level_shift
from kvwatch.forecast.thresholds import BUCKET_SECONDS, SATURATION_USAGE

RISK_HORIZONS_SECONDS: tuple[int, ...] = (300, 900, 1800)
_SQRT2 = math.sqrt(2.0)


def _normal_upper_tail(z: float) -> float:
    """P(Z ≥ z) for a standard normal: ``1 − NormalDist().cdf(z)`` without the method call (this runs 61
    times a minute per series), the same arithmetic to the bit."""
    return 1.0 - 0.5 * (1.0 + math.erf(z / _SQRT2))


@dataclass(frozen=True)
class RiskParams:
    # the saturation threshold of the polls, a fraction of capacity (the forecaster sets it from ForecastParams.u_sat,
    # the one threshold the demand model, the detector and the advice aim at too)
    threshold: float = SATURATION_USAGE
    # A minute whose mean is within_k within-minute standard deviations below the threshold has polls at it:
    # the per-minute mean's effective threshold is ``threshold·C − within_k·σ_within`` (tuned, forecasting.md),
    # lowered no further than the polls reach above their mean (within_reach).
    within_k: float = 1.0
    window_buckets: int = 30  # minutes of polls for the dispersion index and the token inflow
    distribution: str = "gamma"  # "gaussian" or "gamma" (moment-matched)
    flux_scale: float = 1.0  # multiplies the crossing rate (tuned on the tuning traces only)
    size_floor: float = 1.0  # × histogram mean footprint as the floor of s (0: dispersion alone)
    sustain_seconds: float = 120.0  # W: saturation must last this long to be an event
    # "ou": the occupancy starts from the newest minute's mean and relaxes to the projected mean with the
    # correlation time measured from the minute means (at least the residence τ); crossings at the rate of
    # a process with that correlation. "stationary": v2 (the stationary law from now on, time scale τ + W).
    dynamics: str = "ou"
    # How the within-minute spread is summarized: "median" of the minutes' own standard deviations (one
    # long request's spike does not lower the threshold for half an hour) or "pooled" (v2).
    within_sd: str = "median"
    # The threshold is lowered by no more than the polls rise above their minute's mean (the median of the minutes'
    # max − mean): a load swinging between two levels, 0.90 and 0.30, has a wide spread but no poll above 0.90, and
    # with the spread alone its threshold fell below its mean, the risk 1.0 for hours. False: v10.
    within_reach: bool = True
    # Sustained excursions (v4): an event is saturation over most of ``sustain_seconds``, so the process
    # that must cross is the occupancy averaged over that window, whose variance is the minute mean's
    # times g(W/θ)/g(minute/θ) (OU averaging, g(x) = 2(x − 1 + e^(−x))/x²): bursts shorter than the
    # window count less. False: v3 (the minute mean itself).
    sustained: bool = True
    # Recurrence (v4): sustained saturations this series had recently (the bottleneck state's onsets after
    # ``recurrence_quiet_seconds`` without one, over the last ``recurrence_window_seconds``) are a local base
    # rate of events; the risk is also at least that of a Poisson process at that rate. 0: off (v3).
    recurrence_window_seconds: float = 7200.0
    recurrence_quiet_seconds: float = 600.0
    # An onset counts toward the recurrence only while the window's mean usage is at least this share of the load
    # the onset came at (recurrence_load_trough): after the load has fallen away the old saturations say nothing
    # about the next (a compressed day kept `filling` on to the end with usage at 0.10–0.44).
    # 0: off (v9). 0.7 (v10): the tuning family scores as v9 from 0.5 to 0.85 (0.9: Brier 0.0001 worse at 5 and
    # 30 minutes), and 0.7 leaves room on both sides; docs/forecasting-history.md, v10.
    recurrence_load_ratio: float = 0.7
    # The load an onset came at: the lowest window mean of the last 30 minute closes (True), or the window's mean at
    # the onset itself (False, as v10's first version: a saturation reached by a climb was held to the climb).
    recurrence_load_trough: bool = True
    max_horizon_buckets: int = 60
    bucket_seconds: float = BUCKET_SECONDS
    # v5: the worst tail P(K̄_t ≥ c) counts from this projected minute on. The newest minute's own mean (t = 0,
    # no variance left) is a measurement, not a sustained saturation: at 0 (v4) one long request lifting it
    # to c made every horizon's risk 1, and such minutes came true a quarter of the time (tuning set).
    tail_from_minute: int = 1
    # v6: the 30-minute line's slope, read at the newest minute, is shrunk by the share of it that is signal,
    # ``max(0, 1 − 1/t²)`` with ``t`` the slope over its standard error (inflated by ``(1 + ρ)/(1 − ρ)`` for the
    # minute means' lag-1 autocorrelation). On a steady load the slope of 30 noisy minute means is mostly
    # noise, and read 14.5 minutes past the window's centre it tilts the level; a real ramp keeps its slope.
    # False: v5 (the line as fitted).
    level_shrink: bool = True
    level_shrink_autocorrelation: bool = True  # inflate the slope's variance for autocorrelated residuals
    # v7: the floor of ``s`` from the length histograms' buckets instead of their means. "mean": v6 (the mean
    # footprint E[P] + E[G]). "tail": E[S²]/E[S] with S = P + G, P and G independent (D independent of S).
    # "tail-d": E[S³]/E[S²] (D ∝ S: long requests also live longer). "tail-burst": "tail" times the index of
    # dispersion of the per-minute finished-request counts (at least 1): arrivals that come in clusters, not
    # Poisson, multiply the shot noise's variance; "mean-burst": the mean footprint times that (a control).
    # Each bucket (a, b] is uniform, the open top bucket a point at its lower bound (at most max-model-len
    # there); without buckets: "mean". "tail-cluster": "tail" plus (count dispersion − 1) × the mean footprint
    # (the variance of a minute's sum over a clustered number of arrivals).
    size_floor_from: str = "mean"
    # v8: where one shift of level explains the last 30 minute means this many times better than the line
    # (robust.level_shift), the level is the mean after it (never above the line) and the spread the one around
    # the two levels: a step up to a flat plateau read as a steep line overshot the plateau, and the step counted
    # as noise (30 minutes of `filling` on a flat cache). 0: off (v6). 3 (tuned: docs/forecasting-history.md, v8).
    shift_ratio: float = 3.0
    shift_post_line: bool = True  # after the shift a line of its own, not a constant (a step, then a ramp)
    # A fall of level read from fewer minutes after it than a shift needs (0: off): traffic that falls from 0.9 to
    # 0.2 counted the step as noise until five minutes after it, the level near the old one: risk 0.92 at 30
    # minutes, `filling` for 11 minutes after the load fell (a review's synthetic step down).
    fall_min_buckets: int = 1
    # v9: the floor is Poisson shot noise, whose count of requests in flight is Poisson (variance = mean). Scaled
    # by the measured ratio (running_dispersion, at most 1): a gateway or max-num-seqs that keeps a fixed number
    # of long requests in flight has a steady count, and its occupancy is steady too (4.5 hours of `filling` at a
    # flat 0.88). False: v8.
    floor_by_running_dispersion: bool = True
    tail_window_buckets: int = 30  # minutes of bucket deltas the request-size tail is estimated over
    count_dispersion_power: float = 1.0  # "tail-burst": the tail times (count dispersion) ** this
    count_dispersion_free_only: bool = False  # "tail-cluster": count only minutes with nothing waiting


@dataclass(frozen=True)
class RiskEstimate:
    risk: tuple[float, ...]  # cumulative P(reach c) by the end of minute 1..max_horizon
    mean_tokens: float  # λ·E[S·D] now
    variance_tokens2: float  # λ·E[S²·D] now
    size_tokens: float  # s = E[S²·D]/E[S·D]
    residence_seconds: float  # τ, the occupancy's time scale
    bucket_seconds: float
    # The level is a fall's, read from its first minutes (RiskParams.fall_min_buckets): the warning neither counts
    # the minute towards `filling` nor lets it reset a run under way (a one-minute drain on a ramp lost the warning).
    level_from_fall: bool = False

    def at(self, horizon_seconds: float) -> float:
        """Risk of reaching the threshold within ``horizon_seconds`` (interpolated between minutes)."""
        if horizon_seconds <= 0 or not self.risk:
            return 0.0
        steps = horizon_seconds / self.bucket_seconds
        i = min(len(self.risk), math.ceil(steps))
        lo = self.risk[i - 2] if i >= 2 else 0.0
        hi = self.risk[i - 1]
        frac = steps - (i - 1)
        return lo + (hi - lo) * min(1.0, max(0.0, frac))

    def eta_seconds(self, level: float = 0.5) -> float:
        """First time the risk reaches ``level`` (interpolated), +Inf beyond the last horizon."""
        previous = 0.0
        for i, value in enumerate(self.risk):
            if value >= level:
                fraction = (level - previous) / (value - previous) if value > previous else 1.0
                return (i + fraction) * self.bucket_seconds
            previous = value
        return math.inf


def _tail_and_density(c: float, mean: float, var: float, distribution: str) -> tuple[float, float]:
    """(P(K ≥ c), density at c) for a Gaussian or a moment-matched gamma occupancy."""
    if var <= 0 or mean <= 0:
        return (1.0 if mean >= c else 0.0), 0.0
    # Past a shape of 1e6 the gamma's skewness (2/sqrt(shape)) is under 0.002: it is the Gaussian, whose density
    # stays exact where the gamma's log-density, a difference of terms near shape, lost every digit (and overflowed
    # at a variance of 1e-12).
    if distribution == "gaussian" or mean * mean > 1e6 * var:
        sd = math.sqrt(var)
        z = (c - mean) / sd
        return _normal_upper_tail(z), math.exp(-0.5 * z * z) / (sd * math.sqrt(2.0 * math.pi))
    shape, scale = mean * mean / var, var / mean
    x = c / scale
    log_pdf = (shape - 1.0) * math.log(x) - x - math.lgamma(shape) - math.log(scale)
    # Wilson–Hilferty: (X/k)^(1/3) is nearly normal with mean 1 − 1/(9k), variance 1/(9k).
    z = ((x / shape) ** (1.0 / 3.0) - (1.0 - 1.0 / (9.0 * shape))) / math.sqrt(1.0 / (9.0 * shape))
    return _normal_upper_tail(z), math.exp(log_pdf) if log_pdf > -700 else 0.0


def _line_fit(buckets: Sequence[MinuteBucket], window_buckets: int, shrink: bool = False,
              autocorrelated: bool = True, shift_ratio: float = 0.0, shift_post_line: bool = True,
              shift_min_buckets: int = 5, fall_min_buckets: int = 0) -> tuple[float, float, float, float, bool] | None:
    """(dispersion index, line at the newest minute, lag-1 autocorrelation of the residuals, newest mean, whether
    the level is a fall's read sooner than a shift: ``fall_min_buckets``, RiskEstimate.level_from_fall).

    ``shrink``: the slope is multiplied by ``max(0, 1 − 1/t²)`` before the line is read at the newest minute
    (``RiskParams.level_shrink``). ``shift_ratio`` (v8): where one shift of level explains the minutes that many
    times better than the line (robust.level_shift), the fit restarts after it (:func:`_shift_fit`) wherever that
    reads lower than the (shrunk) line."""
    newest = buckets[-1].minute
    points = [(float(b.minute), b.k_mean) for b in buckets
              if b.minute > newest - window_buckets and b.k_mean is not None]
    n = len(points)
    if n < 5:
        return None
    mx, my, sxx, slope, residuals = least_squares(points)
    squares = sum(e * e for e in residuals)
    resid = squares / max(1, n - 2)
    rho = _lag1(points, residuals, squares)
    if shrink and sxx > 0:
        slope *= slope_signal_share(slope, resid / sxx, rho if autocorrelated else 0.0)
    level = my + slope * (points[-1][0] - mx)  # the line at the newest minute: follows a ramp, not a burst
    ys = [y for _, y in points]
    shifted = level_shift(ys, squares, shift_ratio, shift_min_buckets) if shift_ratio else None
    if shifted is None and shift_ratio and 0 < fall_min_buckets < shift_min_buckets:
        # A fall read sooner than a shift: only downward (the level after it below the mean before it), its level
        # the mean of the few minutes since (no line through two points), and only where that lowers the level.
        fallen = level_shift(ys, squares, shift_ratio, fall_min_buckets)
        if fallen is not None and fallen[1] < sum(ys[:fallen[0]]) / fallen[0]:
            fit = _shift_fit(points, fallen[0], False)
            if fit[1] < level:
                return (*fit, True)
    if shifted is not None:
        fit = _shift_fit(points, shifted[0], shift_post_line)
        # Only where it lowers the level: after a late step (or a burst) a line reads below the new level, and a
        # level read from a few minutes after a break would chase every burst (v8 sweep, docs/forecasting-history.md).
        if fit[1] < level:
            return (*fit, False)
        if _flat_after(points, shifted[0]):
            # A level above the line's, and flat since: the line's level stands (it does not chase a burst), but a
            # step to a plateau is no noise: its spread and rho are the shift's, not the line's residuals across
            # the step (a step up to a steady 0.7 read as 30 minutes of bursts: filling for 10-30 minutes).
            # A step that goes on rising keeps the line's: that spread is what warned of it.
            return min(resid / my if my > 0 else 0.0, fit[0]), max(0.0, level), fit[2], points[-1][1], False
    return (resid / my if my > 0 else 0.0), max(0.0, level), rho, points[-1][1], False


def _flat_after(points: Sequence[tuple[float, float]], k: int) -> bool:
    """Whether the minutes after a shift at ``k`` hold no clear trend: their line's slope within two standard errors
    of 0 (the errors inflated by their lag-1 autocorrelation, as :func:`slope_signal_share` does), or falling. The
    shift's own minute, which mixes both levels, is left out."""
    after = points[k + 1:]
    if len(after) < 3:
        return True
    _, _, sxx, slope, residuals = least_squares(after)
    if sxx <= 0 or slope <= 0:
        return True
    squares = sum(e * e for e in residuals)
    variance = squares / max(1, len(residuals) - 2) / sxx
    return slope_signal_share(slope, variance, _lag1(after, residuals, squares)) < TREND_SIGNAL_SHARE


TREND_SIGNAL_SHARE = 0.75
"""A slope is a trend where it is 2 standard errors from 0 (``1 − 1/t²`` at t = 2)."""


def _lag1(points: Sequence[tuple[float, float]], residuals: Sequence[float], squares: float) -> float:
    """Lag-1 autocorrelation of the residuals of consecutive minutes (gaps skipped): how slowly bursts come and go."""
    lagged = sum(residuals[i] * residuals[i + 1] for i in range(len(residuals) - 1)
                 if points[i + 1][0] - points[i][0] == 1)
    return lagged / squares if squares > 0 else 0.0


def _shift_fit(points: Sequence[tuple[float, float]], k: int,
               post_line: bool) -> tuple[float, float, float, float]:
    """_line_fit's figures around a shift of level at ``k``: the mean before it, and after it the mean or
    (``post_line``) a line of its own read at the newest minute, its slope shrunk by ``1 - 1/t²`` as the 30-minute
    line's is, without its autocorrelation inflation (a step followed by a ramp keeps the ramp)."""
    ys = [y for _, y in points]
    n = len(ys)
    before = sum(ys[:k]) / k
    after = sum(ys[k:]) / (n - k)
    tail = [after - y for y in ys[k:]]  # minus the residuals
    if post_line:
        mx, my, sxx, slope, residuals_after = least_squares(points[k:])
        tail = [-e for e in residuals_after]
        if sxx > 0:
            variance = sum(e * e for e in residuals_after) / max(1, n - k - 2)
            slope *= slope_signal_share(slope, variance / sxx, 0.0)
        after = my + slope * (points[-1][0] - mx)
    residuals = [y - before for y in ys[:k]] + [-e for e in tail]
    squares = sum(e * e for e in residuals)
    rho = _lag1(points, residuals, squares)
    mean = sum(ys) / n
    return ((squares / max(1, n - 2)) / mean if mean > 0 else 0.0), max(0.0, after), rho, ys[-1]


def slope_signal_share(slope: float, slope_variance: float, rho: float) -> float:
    """The share of a fitted slope that is signal, ``max(0, 1 − 1/t²)``: ``E[b²] = β² + Var b``, so
    ``(b² − Var b)/b²`` estimates ``β²/E[b²]``, the least-squares shrinkage of ``b`` towards 0. ``Var b`` is the
    ordinary one inflated by ``(1 + ρ)/(1 − ρ)``: positively autocorrelated residuals (slow bursts) make a
    slope look surer than it is."""
    r = min(max(rho, 0.0), 0.95)
    variance = slope_variance * (1.0 + r) / (1.0 - r)
    if variance <= 0.0:
        return 1.0  # an exact line: all signal
    if slope == 0.0:
        return 0.0
    return max(0.0, 1.0 - variance / (slope * slope))


def within_minute_sd(window: Sequence[MinuteBucket], how: str = "pooled") -> float:
    """Standard deviation of the polls around their own minute's mean, in KV tokens: pooled over the
    window, or the median of the minutes' own (robust to a single burst)."""
    if how == "median":
        sds = [b.u_sd * b.capacity_tokens for b in window
               if b.capacity_tokens is not None and len(b.usages) >= 2]
        return statistics.median(sds) if sds else 0.0
    squares = 0.0
    dof = 0
    for b in window:
        if b.capacity_tokens is None or len(b.usages) < 2:
            continue
        mean = sum(b.usages) / len(b.usages)
        squares += sum((u - mean) ** 2 for u in b.usages) * b.capacity_tokens ** 2
        dof += len(b.usages) - 1
    return math.sqrt(squares / dof) if dof else 0.0


def within_minute_reach(window: Sequence[MinuteBucket]) -> float:
    """How far the polls rise above their own minute's mean, in KV tokens: the median of the minutes' max − mean."""
    reach = [(b.u_max - b.u_mean) * b.capacity_tokens for b in window
             if b.capacity_tokens is not None and len(b.usages) >= 2]
    return statistics.median(reach) if reach else 0.0


def _window_sum(window: Sequence[MinuteBucket], name: str) -> float | None:
    values = [getattr(b, name) for b in window]
    if any(v is None for v in values):
        return None
    return float(sum(values))


def mean_prompt(window: Sequence[MinuteBucket]) -> float | None:
    """Mean prompt of the requests finished in ``window`` (the prompt length histogram's sum and count); None
    when none finished or a minute lacks the histogram."""
    total, count = _window_sum(window, "request_prompt_sum"), _window_sum(window, "request_prompt_count")
    return total / count if total is not None and count else None


def mean_footprint(window: Sequence[MinuteBucket]) -> float | None:
    """Mean KV tokens a finished request held at its end, ``E[P] + E[G]`` from the length histograms."""
    ps, pc = _window_sum(window, "request_prompt_sum"), _window_sum(window, "request_prompt_count")
    gs, gc = _window_sum(window, "request_generation_sum"), _window_sum(window, "request_generation_count")
    if None in (ps, pc, gs, gc) or not pc or not gc:
        return None
    return ps / pc + gs / gc  # type: ignore[operator]


def _bucket_moments(bounds: Sequence[float], cumulative: Sequence[float]) -> tuple[float, float, float, float]:
    """(n, Σx, Σx², Σx³) of the observations of one histogram from its cumulative bucket counts: each finite
    bucket ``(a, b]`` uniform, the open top bucket a point at its lower bound (requests are at most
    max-model-len, vLLM's top finite bound, so this errs low by less than one 1-2-5 step)."""
    n = s1 = s2 = s3 = 0.0
    below = 0.0
    lower = 0.0
    for upper, cum in zip(bounds, cumulative, strict=True):
        count = cum - below
        below = cum
        if count > 0:
            a = lower
            b = lower if math.isinf(upper) else upper
            n += count
            s1 += count * (a + b) / 2.0
            s2 += count * (a * a + a * b + b * b) / 3.0
            s3 += count * (a + b) * (a * a + b * b) / 4.0
        if not math.isinf(upper):
            lower = upper
    return n, s1, s2, s3


def _window_counts(window: Sequence[MinuteBucket], bounds_name: str, counts_name: str
                   ) -> tuple[tuple[float, ...], list[float]] | None:
    """The window's summed cumulative bucket deltas of one length histogram (minutes with other bounds or
    none are left out), with their bounds; None without any."""
    bounds: tuple[float, ...] | None = None
    total: list[float] | None = None
    for b in window:
        counts = getattr(b, counts_name)
        if counts is None:
            continue
        these = getattr(b, bounds_name)
        if total is None:
            bounds, total = these, list(counts)
        elif these == bounds:
            total = list(map(add, total, counts))
    return None if total is None or bounds is None else (bounds, total)


def tail_size(window: Sequence[MinuteBucket], how: str) -> float | None:
    """The request-size tail from the length histograms' buckets, ``S = P + G`` with P and G independent:
    ``E[S²]/E[S]`` ("tail": the footprint-weighted size when D is independent of S) or ``E[S³]/E[S²]``
    ("tail-d": D ∝ S). None without bucket deltas of both histograms or without requests."""
    prompt = _window_counts(window, "prompt_length_bounds", "prompt_length_counts")
    generation = _window_counts(window, "generation_length_bounds", "generation_length_counts")
    if prompt is None or generation is None:
        return None
    pn, p1, p2, p3 = _bucket_moments(*prompt)
    gn, g1, g2, g3 = _bucket_moments(*generation)
    if pn <= 0 or gn <= 0:
        return None
    p1, p2, p3 = p1 / pn, p2 / pn, p3 / pn
    g1, g2, g3 = g1 / gn, g2 / gn, g3 / gn
    m1 = p1 + g1
    m2 = p2 + 2.0 * p1 * g1 + g2
    if how == "tail-d":
        m3 = p3 + 3.0 * p2 * g1 + 3.0 * p1 * g2 + g3
        return m3 / m2 if m2 > 0 else None
    return m2 / m1 if m1 > 0 else None


def count_dispersion(window: Sequence[MinuteBucket], free_only: bool = False) -> float:
    """Index of dispersion (variance over mean, around a least-squares line) of the per-minute finished
    requests: 1 for Poisson arrivals, more when they come in clusters; 1 when unknown. ``free_only``: only
    minutes without a request waiting or preempted (a full cache stalls departures and then releases them
    together, which is the engine's clustering, not the arrivals')."""
    points = [(float(b.minute), b.finished) for b in window if b.finished is not None and b.covered_seconds > 0
              and not (free_only and (b.waiting_max > 0 or b.preemptions > 0))]
    index = _detrended_dispersion(points)
    return 1.0 if index is None else max(1.0, index)


def _detrended_dispersion(points: list[tuple[float, float]]) -> float | None:
    """Variance around a least-squares line over the mean, of per-minute values; None with fewer than 5 minutes
    or a mean at or below 0."""
    n = len(points)
    if n < 5:
        return None
    _, mean, _, _, residuals = least_squares(points)
    return sum(e * e for e in residuals) / (n - 2) / mean if mean > 0 else None


def running_dispersion(window: Sequence[MinuteBucket], averaging: float) -> float:
    """The per-minute mean count of running requests: its variance around a least-squares line over what Poisson
    arrivals give a one-minute mean (the mean count times ``averaging``), at most 1; 1 when unknown (fewer than 5
    minutes, or nothing running)."""
    index = _detrended_dispersion([(float(b.minute), b.running_mean) for b in window if b.covered_seconds > 0])
    return 1.0 if index is None or averaging <= 0 else min(1.0, index / averaging)


def mean_residence(window: Sequence[MinuteBucket]) -> float | None:
    """Mean end-to-end latency of requests finished in the window (e2e histogram deltas), over the minutes
    that carry them: the sidecar reads the histogram once a minute, so a minute may have none."""
    carried = [b for b in window if b.e2e_sum is not None and b.e2e_count is not None]
    count = sum(b.e2e_count for b in carried)
    if not count:
        return None
    return sum(b.e2e_sum for b in carried) / count


def residence_seconds(window: Sequence[MinuteBucket], rate_level: float) -> float | None:
    """How long a request holds its KV: the e2e histogram's mean, else Little's law (requests in flight over the
    arrival rate); None when neither is known (no histogram, and no running count or no rate)."""
    residence = mean_residence(window)
    if residence is None and window and rate_level > 0:
        residence = sum(b.running_mean for b in window) / len(window) / rate_level
    return residence if residence is not None and residence > 0 else None


def last_minutes(buckets: Sequence[MinuteBucket], count: int) -> list[MinuteBucket]:
    """The buckets of the newest ``count`` minutes (the risk's moments are measured over ``window_buckets``)."""
    newest = buckets[-1].minute
    return [b for b in buckets if b.minute > newest - count]


def estimate_risk(buckets: Sequence[MinuteBucket], demand: DemandEstimate, p: RiskParams) -> RiskEstimate | None:
    """The risk curve for the next ``max_horizon_buckets`` minutes (None while a moment is unknown)."""
    window = last_minutes(buckets, p.window_buckets)
    capacity = demand.capacity_tokens
    fit = _line_fit(buckets, p.window_buckets, p.level_shrink, p.level_shrink_autocorrelation, p.shift_ratio,
                    p.shift_post_line, fall_min_buckets=p.fall_min_buckets)
    if capacity <= 0 or demand.rate_level <= 0 or fit is None:
        return None
    size, mean0, rho_measured, newest_mean, fell = fit
    if mean0 <= 0:
        return None  # an empty cache: nothing to project (the risk is unknown, not 0)
    residence = residence_seconds(window, demand.rate_level)
    if residence is None:
        return None
    footprint = None
    if p.size_floor_from.startswith("tail"):
        tail_window = window if p.tail_window_buckets == p.window_buckets else last_minutes(
            buckets, p.tail_window_buckets)
        footprint = tail_size(tail_window, "tail-d" if p.size_floor_from == "tail-d" else "tail")
    if footprint is None:
        footprint = mean_footprint(window)
    if footprint is not None and p.size_floor_from.endswith("-burst"):
        footprint *= count_dispersion(window) ** p.count_dispersion_power
    elif footprint is not None and p.size_floor_from == "tail-cluster":
        # A minute's mean is (Σ over its N arrivals of S·D)/minute: Var = E[N]·E[(SD)²] + (Var N − E[N])·E[SD]²,
        # so clustered arrivals (count dispersion I > 1) add (I − 1) mean footprints to the size, not I tails.
        mean = mean_footprint(window)
        if mean is not None:
            footprint += (count_dispersion(window, p.count_dispersion_free_only) - 1.0) * mean
    if footprint is not None:
        # Poisson shot noise averaged over a minute: variance × 2x(1 − x(1 − e^(−1/x))), x = τ / minute.
        x = residence / p.bucket_seconds
        averaging = 2.0 * x * (1.0 - x * (1.0 - math.exp(-1.0 / x)))
        floor = p.size_floor * footprint * averaging
        if p.floor_by_running_dispersion:
            floor *= running_dispersion(window, averaging)
        size = max(size, floor)
    lowered = p.within_k * within_minute_sd(window, p.within_sd)
    if p.within_reach:
        lowered = min(lowered, within_minute_reach(window))
    c = min(capacity, max(0.5 * capacity, p.threshold * capacity - lowered))
    if p.dynamics == "ou":
        estimate = _ou_risk(p, demand, c, size, mean0, newest_mean, residence, rho_measured)
        return replace(estimate, level_from_fall=True) if fell and estimate is not None else estimate
    time_scale = residence + p.sustain_seconds

    def stationary(seconds: float, mean: float, var: float, knee: float) -> tuple[float, float]:
        tail, density = _tail_and_density(c, mean, var, p.distribution)
        return tail, p.flux_scale * math.sqrt(var) * density / (time_scale * knee)

    estimate = _integrate(p, demand, size, mean0, residence, stationary)
    return replace(estimate, level_from_fall=True) if fell else estimate


def _integrate(p: RiskParams, demand: DemandEstimate, size: float, mean0: float, residence: float,
               step: Callable[[float, float, float, float], tuple[float, float]]) -> RiskEstimate:
    """Risk per horizon from ``step(seconds, stationary mean, stationary variance, knee) -> (P(K ≥ c) at that
    time, upcrossing rate of c)``: 1 − (1 − the worst tail so far) × exp(−∫ upcrossing rate), the integral by
    the trapezoid rule over minutes. The projected mean follows the rate trend and the knee; D grows with the
    knee, S does not, so E[S²·D] scales like E[S·D]."""
    bucket_seconds, tail_from = p.bucket_seconds, p.tail_from_minute
    rate_level, elasticity = demand.rate_level, demand.knee_elasticity
    log_survival = 0.0
    worst_tail = 0.0
    previous_rate = None
    risk: list[float] = []
    for minute in range(0, p.max_horizon_buckets + 1):
        seconds = minute * bucket_seconds
        growth = demand.rate_at(seconds) / rate_level
        knee = min(2.0, max(1.0, growth) ** elasticity)
        stationary_mean = mean0 * growth * knee
        tail, crossing_rate = step(seconds, stationary_mean, size * stationary_mean * knee, knee)
        if minute >= tail_from and tail > worst_tail:
            worst_tail = tail
        if previous_rate is not None:
            log_survival -= 0.5 * (previous_rate + crossing_rate) * bucket_seconds
            risk.append(1.0 - (1.0 - worst_tail) * math.exp(log_survival))
        previous_rate = crossing_rate
    return RiskEstimate(tuple(risk), mean0, size * mean0, size, residence, p.bucket_seconds)


def _ou_averaging(x: float) -> float:
    """Variance of an OU process averaged over ``x`` correlation times, over its point variance."""
    return 1.0 if x < 1e-6 else 2.0 * (x - 1.0 + math.exp(-x)) / (x * x)


def sustained_variance_ratio(theta: float, sustain_seconds: float, bucket_seconds: float) -> float:
    """Variance of the occupancy averaged over the event window ``W`` over that of a minute mean: bursts
    shorter than ``W`` (short ``θ``) are averaged away, slow ones (``θ`` ≫ ``W``) are not."""
    return _ou_averaging(sustain_seconds / theta) / _ou_averaging(bucket_seconds / theta)


def with_recurrence(estimate: RiskEstimate, onsets: int, seconds_observed: float,
                    window_seconds: float) -> RiskEstimate:
    """Combine the excursion risk with the series' local base rate of events: ``onsets`` sustained
    saturations began in the last ``seconds_observed`` (at most the window). The rate
    ``onsets / (seconds_observed + window/4)`` (a quarter window of prior quiet, so one event in a short
    history is no certainty) gives ``1 − e^(−rate·h)``; the two are combined as independent causes.
    Repeating saturations (a load that saturates from bursts every half hour) are what the occupancy's
    moments alone miss: between bursts the cache looks calm."""
    if onsets <= 0:
        return estimate
    rate = onsets / (seconds_observed + 0.25 * window_seconds)
    step = estimate.bucket_seconds
    combined = [1.0 - (1.0 - r) * math.exp(-rate * step * (i + 1)) for i, r in enumerate(estimate.risk)]
    return replace(estimate, risk=tuple(combined))


def correlation_seconds(residence: float, rho_measured: float, bucket_seconds: float, window_buckets: int) -> float:
    """The occupancy's correlation time: at least the residence ``τ`` (one request's shot), longer when the
    minute means are measured to move slowly (lag-1 autocorrelation ``ρ``: ``−minute / ln ρ``), capped at
    the window they were measured over."""
    measured = -bucket_seconds / math.log(min(rho_measured, 0.999)) if rho_measured > 0 else 0.0
    return min(max(residence, measured), window_buckets * bucket_seconds)


def _ou_risk(p: RiskParams, demand: DemandEstimate, c: float, size: float, mean0: float, newest: float,
             residence: float, rho_measured: float) -> RiskEstimate:
    """Shot noise conditioned on now (Ornstein–Uhlenbeck-like): the minute mean starts at ``newest`` and
    relaxes to the projected mean ``μ(t)`` with correlation time ``θ``: mean ``μ(t) + (x₀ − μ(0))·e^(−t/θ)``,
    variance ``σ²(t)·(1 − e^(−2t/θ))``. Upcrossings of ``c`` by minute means whose consecutive values
    correlate as ``ρ = e^(−minute/θ)`` happen at ``σ(t)·f_t(c)·√((1 − ρ)/π)`` per minute (Rice's formula
    with the derivative's spread ``σ·√(2(1 − ρ))`` per minute): slow bursts cross rarely, a cache far
    below ``c`` cannot get there in five minutes.
    """
    theta = correlation_seconds(residence, rho_measured, p.bucket_seconds, p.window_buckets)
    rho = math.exp(-p.bucket_seconds / theta)
    per_minute = math.sqrt((1.0 - rho) / math.pi)
    averaging = sustained_variance_ratio(theta, p.sustain_seconds, p.bucket_seconds) if p.sustained else 1.0

    flux_scale, bucket_seconds, distribution = p.flux_scale, p.bucket_seconds, p.distribution
    offset = newest - mean0

    def conditioned(seconds: float, stationary_mean: float, stationary_var: float, knee: float) -> tuple[float, float]:
        stationary_var *= averaging
        decay = math.exp(-seconds / theta)
        mean = stationary_mean + offset * decay
        var = stationary_var * (1.0 - decay * decay)
        tail, density = _tail_and_density(c, max(mean, 1e-9), var, distribution)
        return tail, flux_scale * math.sqrt(stationary_var) * density * per_minute / bucket_seconds

    return _integrate(p, demand, size, mean0, residence, conditioned)
