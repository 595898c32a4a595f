"""``kvwatch_*`` metric families of the forecast, the state machine and the advisor (names are contract).

The collector calls ``forecast_metric_families`` once per scrape with every series' latest result; each
family appears once with one sample per series (labels ``model_name``, ``engine``). Gauges with no value
(e.g. the ETA while the state is ``unknown``) are left out rather than exported as NaN; the state family
is always complete: all seven states, exactly one of them 1.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

from prometheus_client.core import GaugeMetricFamily, Metric

from kvwatch.advisor import ACTIONS, Advice
from kvwatch.forecast.detector import STATES, UNKNOWN
from kvwatch.forecast.forecaster import ForecastParams, ForecastResult

HORIZON_LABELS: dict[int, str] = {600: "10m", 1800: "30m"}
RISK_LABELS: dict[int, str] = {300: "5m", 900: "15m", 1800: "30m"}
_POLL_NOTE = " kvwatch polls the engine on its own timer; estimates use per-minute aggregates of those polls."

# The numbers in the HELP texts come from the parameters the forecaster runs with (serve uses the defaults).
_P = ForecastParams()


def _ordinal(q: float) -> str:
    n = round(q * 100)
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


# (metric name, estimates key, HELP)
INNER_ESTIMATES: tuple[tuple[str, str, str], ...] = (
    ("kvwatch_forecast_token_seconds_per_request", "token_seconds_per_request",
     "KV token-seconds one request holds (Little's law A = mean KV tokens / request rate"
     + (", mix-corrected)." if _P.demand.mix_correction else ").")),
    ("kvwatch_forecast_demand_tokens", "demand_tokens",
     "Mean KV demand in tokens: request rate level times token-seconds per request (not capped at capacity)."),
    ("kvwatch_forecast_burst_factor", "burst_factor",
     f"Ratio of the {_ordinal(_P.demand.burst_quantile)} percentile of the KV usage polls of the last "
     f"{_P.demand.burst_window_buckets} minutes to their mean (how far bursts rise above the mean, at least 1)."),
    ("kvwatch_forecast_request_rate_slope_per_second", "request_rate_slope",
     f"Theil-Sen slope of the arrival rate over the last {_P.demand.rate_window_buckets} minutes (since a shift "
     "of level in them: 0 until 10 minutes follow it), requests per second per second."),
    ("kvwatch_forecast_request_rate_slope_lower_per_second", "request_rate_slope_lower",
     f"Lower bound of the {_P.demand.confidence:.0%} confidence interval of the arrival-rate slope "
     "(above 0: significantly rising)."),
    ("kvwatch_forecast_usage_level_ratio", "usage_level",
     f"Mean of the last {_P.level_buckets} per-minute p90 KV usages (the trend forecaster's level)."),
    ("kvwatch_forecast_usage_slope_per_second", "usage_slope_per_second",
     f"Theil-Sen slope of per-minute p90 KV usage over the last {_P.trend_window_buckets} minutes, per second."),
    ("kvwatch_forecast_usage_slope_lower_per_second", "usage_slope_lower_per_second",
     f"Lower bound of the {_P.trend_confidence:.0%} confidence interval of the usage slope "
     "(above 0: significantly rising)."),
    ("kvwatch_forecast_occupancy_mean_tokens", "occupancy_mean_tokens",
     f"KV tokens in use now by a least-squares line through the last {_P.risk.window_buckets} per-minute means, "
     "its slope shrunk by the share of it that is signal, restarted after a shift of level where that reads lower "
     "(the level the saturation risk projects from; a fitted level, which can read above the capacity while a "
     "rising load saturates it)."),
    ("kvwatch_forecast_occupancy_sd_tokens", "occupancy_sd_tokens",
     "Standard deviation of per-minute KV tokens in use in the shot-noise model: sqrt(request size x mean)."),
    ("kvwatch_forecast_request_size_tokens", "request_size_tokens",
     f"Footprint-weighted request size E[S²·D]/E[S·D]: variance over mean of per-minute KV tokens over "
     f"{_P.risk.window_buckets} minutes (around their line, or the two levels of a shift), at least the Poisson "
     "value from the mean prompt+output length (scaled by the running count's dispersion, at most 1)."),
    ("kvwatch_forecast_residence_seconds", "residence_seconds",
     "Mean time a request stays in the engine (e2e latency histogram sum/count; running/rate without it)."),
    ("kvwatch_forecast_warm", "warm",
     f"1 once the forecaster's fits are warm (the risk needs a rate, a capacity and a residence too: absent without "
     f"them, no early warning then); 0 while it warms up after a "
     f"(re)start ({_P.warmup_seconds:g} s, then {_P.min_buckets} fitted minutes) or re-warms after a gap in the polls "
     "(a filling warning raised before the gap then stands, its risk unknown)."),
    ("kvwatch_forecast_warning_risk", "warning_risk",
     f"The saturation risk the filling warning reads, at its {_P.warning.horizon_seconds / 60:g}-minute horizon: "
     "the model's, before the self-calibration kvwatch_kv_saturation_risk publishes (the two differ where this "
     "series' forecasts have long come true more or less often than said). filling comes on after "
     f"{_P.warning.warn_for_buckets} minutes in a row at or above {_P.warning.risk_on:g} "
     f"({_P.warning.rearm_for_buckets} after a saturation, which ends it) and clears after "
     f"{_P.warning.clear_for_buckets} in a row below {_P.warning.risk_off:g} (an idle minute counts as one), at "
     f"once when the first warm minute after a re-warm reads below {_P.warning.risk_off:g}, or once no risk has "
     "backed it for its horizon; recomputed at each minute's close, absent while warming up."),
    ("kvwatch_forecast_saturated_sample_ratio", "saturated_sample_fraction",
     f"Share of the last {_P.detector.fire_window_seconds / 60:g} minutes' polls that were saturated "
     f"(bottleneck fires at {_P.detector.fire_fraction:g})."),
)
RESTART_HELP = (f"Seconds since the last detected restart (or kvwatch start); warnings need "
                f"{_P.warmup_seconds:g} s of warm-up and {_P.min_buckets} fitted minutes after it.")


def forecast_metric_families(
    series: Iterable[tuple[Mapping[str, str], ForecastResult, Sequence[Advice]]],
) -> list[Metric]:
    """Families for ``(series_labels, result, advice)`` triples; labels are e.g. ``{"model_name", "engine"}``."""
    items = list(series)
    if not items:
        return []
    label_names = list(items[0][0].keys())

    def gauge(name: str, doc: str, extra: Sequence[str] = ()) -> GaugeMetricFamily:
        return GaugeMetricFamily(name, doc + _POLL_NOTE, labels=[*label_names, *extra])

    eta = gauge("kvwatch_kv_exhaustion_eta_seconds",
                f"First time the saturation risk reaches 0.5 (within {_P.risk.max_horizon_buckets} minutes): 0 in "
                "bottleneck, +Inf when it does not or with nothing to project (idle); absent when unknown (also "
                "while warming up with work in the cache, and while a warning stands through a re-warm after a "
                "gap), and when the engine "
                "is busy with no arrival rate or capacity to project from (no finished-request counter, no KV "
                "capacity, or no request finished yet after an idle spell), or how long a request holds its KV "
                "is unknown (no running-requests gauge and no e2e latency histogram). Recomputed each minute: "
                "on a steady load a median wait, not a countdown (it need not fall by a minute a minute).")
    risk = gauge("kvwatch_kv_saturation_risk",
                 f"Probability that KV usage reaches {_P.risk.threshold:g} of capacity for a sustained stretch "
                 "within the horizon, self-calibrated against how this series' forecasts of the last 6 hours "
                 "came true "
                 "(in bottleneck the published risk, not 1; 1 before the model has one; absent while warming up "
                 "(and while a filling warning stands through a re-warm after a gap) or unknown, and "
                 "while the engine is idle: no arrivals or an empty cache leave nothing to project).",
                 ["horizon"])
    ratio = gauge("kvwatch_kv_usage_forecast_ratio",
                  "Forecast peak KV usage at the horizon, in demand units: the projected mean times the measured "
                  "burst factor, so it may exceed 1 on a bursty load far from saturation; alert on "
                  "kvwatch_kv_saturation_risk, not on this.",
                  ["horizon"])
    state = gauge("kvwatch_state", "Forecaster state, one-hot over all states.", ["state"])
    rate = gauge("kvwatch_request_rate_per_second", "Smoothed arrival rate (finished + growth of running+waiting).")
    headroom = gauge("kvwatch_headroom_requests_per_second",
                     "Additional arrival rate before bursts reach the saturation threshold (negative: over), "
                     "estimated from the last 30 minutes: early in a saturation it can still read positive.")
    concurrency = gauge("kvwatch_recommended_max_concurrency",
                        "Concurrency limit per engine that keeps its KV usage under the threshold at the observed "
                        "mix; a data-parallel pod's gateway limit is the smallest engine's times its engines "
                        "(absent on a PD prefill server, and while KV is held with nothing running).")
    recommendation = gauge("kvwatch_recommendation",
                           "Advisor: rank of each fix (1 = cheapest first) while filling or in bottleneck, else 0.",
                           ["action"])
    etas = gauge("kvwatch_forecast_eta_seconds", "ETA of each forecaster alone (+Inf: not rising).", ["method"])
    inner = {key: gauge(name, doc) for name, key, doc in INNER_ESTIMATES}
    restart = gauge("kvwatch_forecast_since_restart_seconds", RESTART_HELP)

    for labels, result, advice in items:
        values = [labels[n] for n in label_names]
        for s in STATES:
            state.add_metric([*values, s], 1.0 if result.state == s else 0.0)
        if result.state == UNKNOWN:
            continue  # only the state is exported
        _maybe(eta, values, result.eta_seconds)
        for horizon, label in RISK_LABELS.items():
            _maybe(risk, [*values, label], result.risk.get(horizon))
        for horizon, label in HORIZON_LABELS.items():
            forecast = result.forecast_ratio.get(horizon)
            if forecast is not None:
                ratio.add_metric([*values, label], forecast)
        _maybe(rate, values, result.request_rate_per_second)
        _maybe(headroom, values, result.headroom_requests_per_second)
        _maybe(concurrency, values, result.recommended_max_concurrency)
        ranks = {a.action: a.rank for a in advice}
        for action in ACTIONS:
            recommendation.add_metric([*values, action], float(ranks.get(action, 0)))
        for method in ("demand", "trend"):
            _maybe(etas, [*values, method], result.estimates.get(f"{method}_eta_seconds"))
        for _, key, _ in INNER_ESTIMATES:
            _maybe(inner[key], values, result.estimates.get(key))
        minutes = result.estimates.get("minutes_since_restart")
        _maybe(restart, values, None if minutes is None else minutes * 60.0)
    families = [eta, risk, ratio, state, rate, headroom, concurrency, recommendation, etas, *inner.values(), restart]
    return [f for f in families if f.samples]


def _maybe(family: GaugeMetricFamily, labels: list[str], value: float | None) -> None:
    if value is not None and not math.isnan(value):
        family.add_metric(labels, float(value))
