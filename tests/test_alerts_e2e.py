"""End to end with real components: the simulator saturates at an accelerated clock, ``kvwatch serve``
watches it with its forecast clock at the same speed, a real Prometheus scrapes kvwatch and evaluates the
rule pack, a real Alertmanager routes to a webhook this test runs.

Prometheus evaluates ``for:`` in real time, so it loads a copy of the pack whose ``for:`` values are divided
by the clock speed (tests/e2e/rules_for_e2e.py); the test proves nothing else differs. Range windows stay
in real time, though: KVCacheBottleneck's 2-minute medians span 120 simulated minutes here, so it fires about
a real minute after the cache saturates, far later than it would at 1x. That the critical arrives after the
warning is therefore no evidence by itself. What the test measures is the warning against the saturation
itself, on Prometheus' own samples of kvwatch (one a second: a simulated minute). Saturation is when
KVCacheBottleneck's condition first holds in simulated time: the medians of usage (>= 0.95) and of waiting
requests (> 0) over the last 2 simulated minutes, i.e. when the page would go pending at 1x; single bursts
to a full cache come earlier (usage on this small cache swings by 0.5 from one minute to the next) and are
only reported. ``KVCacheExhaustionForecast`` must reach the webhook as a forecast (a risk, not "saturated
now") at least ``MIN_LEAD_SIM_MINUTES`` simulated minutes before saturation, and before kvwatch's state
turns ``bottleneck``; it must not resolve before ``KVCacheBottleneck`` fires (the hand-off); both carry the
target's labels; the recording rules answer. (The bottleneck's own timing is promtool's job:
alerts/tests/bottleneck.test.yaml.)

Every process is started on loopback with free ports and stopped by its PID in ``finally``.
"""

from __future__ import annotations

import sys
import time
from itertools import pairwise
from pathlib import Path

import pytest

from e2e.harness import (
    LOOPBACK,
    Process,
    WebhookReceiver,
    alertmanager_config,
    free_port,
    get_json,
    http_get,
    prometheus_config,
    prometheus_query,
    prometheus_samples,
    require_binary,
    wait_until_ready,
)
from e2e.queries import dashboard_queries
from e2e.rules_for_e2e import differences_besides_for, for_durations, shorten_for

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[1]
RULES = ROOT / "alerts" / "kvwatch-rules.yaml"

SPEED = 60.0  # simulated seconds per wall second, for the simulator and kvwatch's forecast clock alike
MODEL = "e2e-llama"
BLOCKS, BLOCK_SIZE = 4096, 16
# A ramp that crosses the forecaster's warm-up (15 simulated minutes + 15 one-minute buckets) below
# saturation, then reaches the cache's limit (~11 req/s with this engine) around minute 50. Replayed
# offline through kvwatch's parser, adapter and forecaster (12-s polls), the forecaster says `filling`
# from minute 33 to 50 (ETA 12 min at first) and `bottleneck` from minute 50; the queue grows from 51.
SIMULATOR_ARGS = [
    "--vllm-version", "0.33", "--model-name", MODEL, "--num-gpu-blocks", str(BLOCKS), "--block-size",
    str(BLOCK_SIZE), "--profile", "ramp", "--rate", "4", "--rate-end", "13", "--period-seconds", "3600",
    "--prompt-tokens", "1000", "--output-tokens", "400", "--step-decode-token-ms", "0.03",
    "--step-prefill-token-ms", "0.015", "--seed", "0",
]
POLL_SECONDS = 0.2  # real seconds: 12 simulated seconds between kvwatch's samples
TARGET_LABELS = {"namespace": "e2e", "pod": "vllm-e2e-0"}
DEADLINE_SECONDS = 170.0  # from Prometheus start to both notifications (simulated ~2.8 h)
# Seen on this ramp: the forecaster says `filling` 11-15 simulated minutes before saturation (later on a
# loaded machine), the alert's `for` and delivery take ~2.5, so the warning leads by ~8-13. Three keeps room
# for a CI machine shared with others while staying far from trivially true.
MIN_LEAD_SIM_MINUTES = 3.0
SATURATION_WINDOW_SECONDS = 120 / SPEED  # KVCacheBottleneck's 2-minute medians, in simulated time


def test_forecast_reaches_alertmanager_before_bottleneck(tmp_path: Path) -> None:
    prometheus_bin = require_binary("prometheus")
    alertmanager_bin = require_binary("prometheus-alertmanager")

    source = RULES.read_text()
    rules_copy = shorten_for(source, SPEED)
    assert differences_besides_for(source, rules_copy) == []
    rule_file = tmp_path / "kvwatch-rules-e2e.yaml"
    rule_file.write_text(rules_copy)

    sim_port, kvwatch_port, prometheus_port, alertmanager_port = (free_port() for _ in range(4))
    prometheus_url = f"http://{LOOPBACK}:{prometheus_port}"
    webhook = WebhookReceiver()
    processes: list[Process] = []
    try:
        (tmp_path / "alertmanager.yml").write_text(alertmanager_config(webhook.url))
        processes.append(Process("alertmanager", [
            alertmanager_bin, f"--config.file={tmp_path / 'alertmanager.yml'}",
            f"--storage.path={tmp_path / 'am-data'}", f"--web.listen-address={LOOPBACK}:{alertmanager_port}",
            "--cluster.listen-address=",
        ], tmp_path))
        wait_until_ready(f"http://{LOOPBACK}:{alertmanager_port}/-/ready", processes[-1], 30)

        processes.append(Process("simulator", [
            sys.executable, "-m", "kvwatch", "simulate", "--listen-address", LOOPBACK, "--port", str(sim_port),
            "--clock-speed", str(SPEED), *SIMULATOR_ARGS,
        ], tmp_path))
        wait_until_ready(f"http://{LOOPBACK}:{sim_port}/metrics", processes[-1], 30)

        processes.append(Process("kvwatch", [
            sys.executable, "-m", "kvwatch", "serve", "--target-url", f"http://{LOOPBACK}:{sim_port}/metrics",
            "--listen-address", LOOPBACK, "--port", str(kvwatch_port),
            "--poll-interval-seconds", str(POLL_SECONDS), "--clock-speed", str(SPEED),
            # The forecast analyzer takes --stale-after-seconds as its own staleness bound without scaling it by
            # --clock-speed: the default (3 x 0.2 real s) would call every 12-simulated-second gap stale and
            # leave only the trend forecaster. 30 s is right either way (no gap in this run is that long).
            "--stale-after-seconds", "30",
        ], tmp_path))
        kvwatch = processes[-1]
        wait_until_ready(f"http://{LOOPBACK}:{kvwatch_port}/metrics", kvwatch, 30)

        (tmp_path / "prometheus.yml").write_text(
            prometheus_config(rule_file, kvwatch_port, alertmanager_port, TARGET_LABELS))
        processes.append(Process("prometheus", [
            prometheus_bin, f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'prom-data'}", f"--web.listen-address={LOOPBACK}:{prometheus_port}",
            "--rules.alert.resend-delay=2s", "--storage.tsdb.retention.time=1d",
        ], tmp_path))
        wait_until_ready(f"{prometheus_url}/-/ready", processes[-1], 60)

        # Prometheus evaluates exactly the shortened copy.
        loaded: dict[str, list[float]] = {}  # one alert may be several rules (KvwatchTargetDown)
        for group in get_json(f"{prometheus_url}/api/v1/rules")["data"]["groups"]:
            for rule in group["rules"]:
                if rule["type"] == "alerting":
                    loaded.setdefault(rule["name"], []).append(rule["duration"])
        assert loaded == for_durations(rules_copy)

        deadline = time.monotonic() + DEADLINE_SECONDS
        while time.monotonic() < deadline and not webhook.first("KVCacheBottleneck"):
            dead = [p.name for p in processes if not p.alive()]
            assert not dead, f"{dead} exited:\n" + "\n".join(p.tail() for p in processes)
            time.sleep(1.0)

        forecast, bottleneck = webhook.first("KVCacheExhaustionForecast"), webhook.first("KVCacheBottleneck")
        diagnosis = _diagnosis(prometheus_url, kvwatch_port, webhook, processes)
        assert forecast is not None, "KVCacheExhaustionForecast never reached the webhook\n" + diagnosis
        assert bottleneck is not None, "KVCacheBottleneck never reached the webhook\n" + diagnosis

        target = {"instance": f"{LOOPBACK}:{kvwatch_port}", "job": "kvwatch", **TARGET_LABELS,
                  "model_name": MODEL, "engine": "0"}
        assert forecast.labels == {"alertname": "KVCacheExhaustionForecast", "severity": "warning", **target}
        assert bottleneck.labels == {"alertname": "KVCacheBottleneck", "severity": "critical", **target}
        for note in (forecast, bottleneck):
            assert f"model {MODEL} (engine 0) on pod e2e/vllm-e2e-0" in note.annotations["description"]
            assert note.annotations["runbook_url"].endswith("#" + note.labels["alertname"].lower())
        # It arrived as a forecast (state filling: "in 5m 7s" or "now"), not as "saturated now" (bottleneck).
        assert forecast.annotations["summary"].startswith(f"KV cache of {MODEL}: "), (
            forecast.annotations["summary"] + "\n" + diagnosis)

        # When did the cache saturate? Prometheus' own samples of kvwatch, one a second (a simulated minute).
        series = f'{{model_name="{MODEL}", engine="0"}}'
        usage = dict(prometheus_samples(prometheus_url, f"kvwatch_kv_usage_ratio{series}"))
        waiting = dict(prometheus_samples(prometheus_url, f"kvwatch_requests_waiting{series}"))
        state = prometheus_samples(prometheus_url, f'kvwatch_state{{model_name="{MODEL}", state="bottleneck"}}')
        times = sorted(set(usage) & set(waiting))
        first_burst = next((t for t in times if usage[t] >= 0.95 and waiting[t] > 0), None)
        saturated = next((t for t in times if _bottleneck_condition(t, times, usage, waiting)), None)
        bottleneck_state = min((t for t, v in state if v == 1), default=None)
        timeline = (f"forecast at {forecast.wall:.1f}; first burst to full and queueing at {first_burst}; saturated "
                    f"(2-simulated-minute medians) from {saturated}; state bottleneck from {bottleneck_state}; "
                    f"KVCacheBottleneck at {bottleneck.wall:.1f} (unix s, x{SPEED:.0f}: 1 s = 1 simulated minute)\n")
        assert saturated is not None and bottleneck_state is not None, timeline + diagnosis
        lead_sim_minutes = (saturated - forecast.wall) * SPEED / 60
        assert lead_sim_minutes >= MIN_LEAD_SIM_MINUTES, (
            f"the forecast led the saturation by {lead_sim_minutes:.1f} simulated minutes\n" + timeline + diagnosis)
        assert forecast.wall < bottleneck_state < bottleneck.wall, timeline + diagnosis
        print(f"lead {lead_sim_minutes:.1f} simulated minutes; {timeline}")  # shown with pytest -rP

        # The hand-off: the warning stays firing while the cache saturates, until the critical takes over. (v5's
        # re-arm ends a warning only once kvwatch's bottleneck state has ended; on this ramp it holds to the page.)
        resolved_early = [n for n in webhook.of("KVCacheExhaustionForecast")
                          if n.status == "resolved" and n.received < bottleneck.received]
        assert not resolved_early, ("the forecast resolved before KVCacheBottleneck fired\n" + timeline + diagnosis
                                    + "\n" + _states(prometheus_url))

        # The fleet recording rules answer: the cache is full now, its capacity is the simulator's.
        capacity = prometheus_query(prometheus_url, 'namespace_model_name:kvwatch_kv_capacity_tokens:sum'
                                                    f'{{namespace="e2e", model_name="{MODEL}"}}')
        assert [float(s["value"][1]) for s in capacity] == [BLOCKS * BLOCK_SIZE]
        fleet_usage = prometheus_query(prometheus_url, 'max_over_time(namespace_model_name:kvwatch_kv_usage:ratio'
                                                       f'{{namespace="e2e", model_name="{MODEL}"}}[1m])')
        assert len(fleet_usage) == 1 and 0.9 <= float(fleet_usage[0]["value"][1]) <= 1.0
        states = prometheus_query(prometheus_url, 'namespace_model_name_state:kvwatch_state:sum{namespace="e2e"}')
        engines_by_state = {s["metric"]["state"]: float(s["value"][1]) for s in states}
        assert set(engines_by_state) == {"ok", "warming_up", "filling", "bottleneck", "scheduler_limited", "stalled",
                                         "unknown"}
        assert engines_by_state["bottleneck"] == 1 and sum(engines_by_state.values()) == 1
        eta = prometheus_query(prometheus_url, 'namespace_model_name:kvwatch_kv_exhaustion_eta_seconds:min'
                                               f'{{namespace="e2e", model_name="{MODEL}"}}')
        assert [float(s["value"][1]) for s in eta] == [0.0]  # in bottleneck

        # Every query of the dashboard runs against this Prometheus (a refused one raises), and every panel this
        # run has data for shows some: a wrong label or metric name leaves a panel at "No data" without an error.
        empty = sorted(q.where for q in dashboard_queries() if not prometheus_query(prometheus_url, q.expr))
        assert sorted(set(empty) - set(EMPTY_WHEN_HEALTHY)) == sorted(EMPTY_IN_THIS_RUN), "\n".join(empty)
    finally:
        for process in reversed(processes):
            process.stop()
        webhook.close()
    assert all(not p.alive() for p in processes)


# Dashboard queries with nothing to show in this run, and why: the run lasts minutes of wall time (a panel's
# offset looks further back), kvwatch has no GPU source, no --model/--gpu (no formula, no what-ifs) and no TTFT
# objective, no value of the target was impossible, and Prometheus scrapes kvwatch only (not vLLM's own page).
EMPTY_IN_THIS_RUN: list[str] = [
    "panel 'Forecast vs actual' B", "panel 'Forecast vs actual' C",  # offset 10m / 30m
    "panel 'GPU memory: used, free and non-KV' A", "panel 'GPU memory: used, free and non-KV' B",
    "panel 'GPU memory: used, free and non-KV' C", "panel 'GPU source (kvwatch_gpu_source_up)' A",
    "panel 'GPU source errors by reason' A", "panel 'Last Xid error' A", "panel 'Non-KV memory growth' A",
    "panel 'Time to GPU memory limit' A",  # no --dcgm-url or --nvml
    "panel 'KV capacity: engine-reported vs formula' B", "panel 'What-if concurrency ceilings' A",  # no model, card
    "panel 'TTFT objective breach and cause' A",  # no --ttft-slo-seconds
    "panel 'Requests: running and waiting' C",  # vllm:num_requests_waiting_by_reason: vLLM's own series
]
# Drawn only when something is wrong (a failed poll or scrape, a dropped series, an impossible value): empty or not,
# as this run's polls went.
EMPTY_WHEN_HEALTHY: list[str] = [
    "panel 'Poll errors by reason' A", "panel 'Series dropped and impossible values' A",
    "panel 'Series dropped and impossible values' B", "panel 'kvwatch reads vLLM (kvwatch_up)' B",
]


def _states(prometheus_url: str) -> str:
    """kvwatch's state changes, gaps in its 30-minute risk and failed polls, as Prometheus sampled them (what
    a resolve of the forecast before the page needs explained)."""
    samples = sorted((t, state) for state in ("ok", "filling", "bottleneck", "warming_up", "unknown")
                     for t, v in prometheus_samples(prometheus_url, f'kvwatch_state{{state="{state}"}}') if v == 1)
    changes = [(round(t, 1), state) for i, (t, state) in enumerate(samples) if i == 0 or samples[i - 1][1] != state]
    risk = sorted(prometheus_samples(prometheus_url, 'kvwatch_kv_saturation_risk{horizon="30m"}'))
    gaps = [(round(a[0], 1), round(b[0], 1)) for a, b in pairwise(risk) if b[0] - a[0] > 1.5]
    up = [round(t, 1) for t, v in prometheus_samples(prometheus_url, "kvwatch_up") if v != 1]
    return f"state changes: {changes}\nrisk samples {len(risk)}, gaps {gaps}\nkvwatch_up != 1 at {up}"


def _median(values: list[float]) -> float:
    """quantile_over_time(0.5, ...): the middle value, or the mean of the two middle ones."""
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def _bottleneck_condition(t: float, times: list[float], usage: dict[float, float],
                          waiting: dict[float, float]) -> bool:
    """KVCacheBottleneck's condition at sample time t, its 2-minute window taken in simulated time (the
    samples of the last SATURATION_WINDOW_SECONDS, plus half a scrape of jitter)."""
    window = [s for s in times if t - SATURATION_WINDOW_SECONDS - 0.5 <= s <= t]
    return _median([usage[s] for s in window]) >= 0.95 and _median([waiting[s] for s in window]) > 0


def _diagnosis(prometheus_url: str, kvwatch_port: int, webhook: WebhookReceiver, processes: list[Process]) -> str:
    """What a person needs to see why an alert did not arrive (best effort: never raises)."""
    parts = [f"webhook received: {webhook.names()}"]
    try:
        alerts = get_json(f"{prometheus_url}/api/v1/alerts")["data"]["alerts"]
        parts.append("prometheus alerts: " + ", ".join(f"{a['labels']['alertname']}={a['state']}" for a in alerts))
    except Exception as exc:  # diagnostics only
        parts.append(f"prometheus alerts unavailable: {exc}")
    history = {  # the whole run (a few wall minutes) as Prometheus saw it
        "seconds in state filling": 'count_over_time((kvwatch_state{state="filling"} == 1)[10m:1s])',
        "seconds in state bottleneck": 'count_over_time((kvwatch_state{state="bottleneck"} == 1)[10m:1s])',
        "lowest finite ETA": "min_over_time((kvwatch_kv_exhaustion_eta_seconds < +Inf)[10m:1s])",
        "seconds with usage >= 0.95": "count_over_time((kvwatch_kv_usage_ratio >= 0.95)[10m:1s])",
    }
    for label, promql in history.items():
        try:
            values = [s["value"][1] for s in prometheus_query(prometheus_url, promql)]
            parts.append(f"{label}: {values or 'none'}")
        except Exception as exc:  # diagnostics only
            parts.append(f"{label}: unavailable ({exc})")
    try:
        metrics = http_get(f"http://{LOOPBACK}:{kvwatch_port}/metrics").decode()
        parts.append("kvwatch now:\n" + "\n".join(
            line for line in metrics.splitlines()
            if line.startswith(("kvwatch_state", "kvwatch_kv_usage_ratio", "kvwatch_kv_exhaustion_eta",
                                "kvwatch_requests_waiting", "kvwatch_up")) and not line.endswith(" 0.0")))
    except Exception as exc:  # diagnostics only
        parts.append(f"kvwatch metrics unavailable: {exc}")
    parts.extend(f"--- {p.name} log:\n{p.tail(15)}" for p in processes)
    return "\n".join(parts)
