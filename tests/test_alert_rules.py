"""The rule pack is valid, tested by promtool, and keeps the conventions the docs promise.

Runs the real ``promtool`` (Debian's prometheus package; ``make tools`` installs it): a missing promtool
fails these tests with a message saying how to install it, it never skips them.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from e2e.rules_for_e2e import differences_besides_for, for_durations, parse_duration, shorten_for
from repo_scripts import load_script

ROOT = Path(__file__).resolve().parents[1]
RULES = ROOT / "alerts" / "kvwatch-rules.yaml"
RULE_TESTS = sorted((ROOT / "alerts" / "tests").glob("*.yaml"))
RUNBOOKS = ROOT / "docs" / "runbooks.md"

# The contract (docs/alerts.md, "The alerts"): alert names and their severities.
ALERTS = {
    "KVCacheBottleneck": "critical",
    "KVCacheExhaustionForecast": "warning",
    "KVCachePreemptionStorm": "warning",
    "VLLMSchedulerLimited": "info",
    "VLLMEngineStalled": "critical",
    "TTFTObjectiveBreach": "warning",
    "VLLMGPUMemoryPressure": "warning",
    "KvwatchTargetDown": "warning",
    "KvwatchAbsent": "warning",
    "KvwatchUsageUnknown": "warning",
    "VLLMContainerRestartLoop": "critical",
    "KvwatchRestartLoop": "warning",
    "KVCacheLeakSuspected": "critical",
    "VLLMRequestExceedsPool": "critical",
}
# kvwatch gauges that vanish or go stale with the sidecar: alerts reading them need the kvwatch_up guard.
DERIVED = re.compile(
    r"kvwatch_(kv_usage_ratio|kv_used_tokens|kv_capacity_tokens|requests_running|requests_waiting|"
    r"preemptions_per_second|max_concurrency|concurrency_headroom|kv_exhaustion_eta_seconds|"
    r"kv_usage_forecast_ratio|kv_saturation_risk|state|whatif_max_concurrency|formula_kv_capacity_tokens|"
    r"ttft_slo_breach|latency_seconds|capacity_finding)\b"
)
# Health alerts: one per target, and no series carries a model_name once polls fail (documented exception).
# Per-GPU alerts: a GPU's series carries no model_name (kvwatch cannot tell data-parallel engines' GPUs apart).
NO_MODEL = {"KvwatchTargetDown", "KvwatchAbsent", "KvwatchUsageUnknown", "VLLMContainerRestartLoop",
            "KvwatchRestartLoop", "VLLMGPUMemoryPressure"}
# Read from kube-state-metrics' series, which never carry the vllm_target label kvwatch's monitors add.
KUBE_STATE = {"VLLMContainerRestartLoop", "KvwatchRestartLoop"}
# Rules whose value is a constant (kvwatch_up == 0, up == 0, absent() == 1, a flag): their text cannot quote it.
CONSTANT_VALUE = {("KvwatchTargetDown", "start"), ("KvwatchAbsent", None), ("KvwatchUsageUnknown", None),
                  ("KVCacheLeakSuspected", None), ("VLLMRequestExceedsPool", None), ("TTFTObjectiveBreach", None)}
# Labels besides severity: KvwatchTargetDown and KvwatchUsageUnknown are two rules each (promtool's lint refuses two
# with equal labels).
EXTRA_LABELS = {"KvwatchTargetDown": {"since"}, "KvwatchUsageUnknown": {"usage"}}
CHART_VALUES = ROOT / "deploy" / "helm" / "kvwatch" / "values.yaml"
GUARD = re.compile(r"\)\s*and on \(instance, job\) \(max_over_time\(kvwatch_up\[2m\]\) == 1 or time\(\) - "
                   r"max_over_time\(kvwatch_last_success_timestamp_seconds\[2m\]\) < 120\)\s*$")
RECORD_NAME = re.compile(r"^[a-z_]+:[a-z0-9_]+:[a-z0-9_]+$")


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool not found on PATH: run `make tools` (installs Debian's prometheus package)")
    return path


def load_rules() -> list[dict]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def alert_rules() -> list[dict]:
    return [rule for rule in load_rules() if "alert" in rule]


def test_promtool_check_rules_passes_including_lint() -> None:
    result = subprocess.run([promtool(), "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_promtool_unit_tests_pass() -> None:
    assert len(RULE_TESTS) >= 5
    result = subprocess.run(
        [promtool(), "test", "rules", *map(str, RULE_TESTS)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("SUCCESS") == len(RULE_TESTS)


# (what the mutation breaks, old text, new text, promtool cases that must then fail)
MUTATIONS = [
    ("the kvwatch_up guard", "(max_over_time(kvwatch_up[2m]) == 1 or", "(max_over_time(kvwatch_up[2m]) >= 0 or",
     ["stale sidecar with a high forecast does not fire"]),
    ("the guard's window", "(max_over_time(kvwatch_up[2m]) == 1 or", "(kvwatch_up == 1 or",
     ["one failed poll in ten does not hold back the pages"]),
    ("the guard's last good poll", "kvwatch_last_success_timestamp_seconds[2m]) < 120)",
     "kvwatch_last_success_timestamp_seconds[2m]) < 0)",
     ["five polls in six timing out do not hold back the page"]),
    ("the guard's two scrapes", "kvwatch_up[2m]", "kvwatch_up[1m]",
     ["one failed scrape at a one-minute interval does not restart the for"]),
    ("the storm's preemptions throughout", "min_over_time(kvwatch_preemptions_per_second[5m]) > 0",
     "min_over_time(kvwatch_preemptions_per_second[5m]) >= 0",
     ["a single burst and a stale sidecar do not make a storm"]),
    ("the bottleneck's queue condition", "quantile_over_time(0.5, kvwatch_requests_waiting[2m]) > 0",
     "quantile_over_time(0.5, kvwatch_requests_waiting[2m]) >= 0",
     ["full cache without queue and stale sidecar do not fire",
      "forecast fires after its for, with the model, pod and risk"]),
    ("the forecast's 30-minute horizon", 'kvwatch_kv_saturation_risk{horizon="30m"}',
     'kvwatch_kv_saturation_risk{horizon=~".+"}',
     ["only the 30-minute risk with the filling state fires, or filling with the risk unknown"]),
    ("the forecast's re-warming branch",
     'max without (state) (last_over_time(kvwatch_state{state="filling"}[2m]) == 1)',
     'max without (state) (last_over_time(kvwatch_state{state="nothing"}[2m]) == 1)',
     ["a warning re-warming after a gap fires as one alert when its risk comes back"]),
    ("the re-warming branch only while re-warming", "(last_over_time(kvwatch_forecast_warm[2m]) == 0)",
     "(last_over_time(kvwatch_forecast_warm[2m]) >= 0)",
     ["only the 30-minute risk with the filling state fires, or filling with the risk unknown"]),
    ("the bottleneck's longer hold", "quantile_over_time(0.5, kvwatch_requests_waiting[5m]) > 0",
     "quantile_over_time(0.5, kvwatch_requests_waiting[2m]) > 0",
     ["a queue that drains between bursts of one saturation pages once"]),
    ("the bottleneck's hold on preemptions", "quantile_over_time(0.5, kvwatch_preemptions_per_second[5m]) > 0",
     "quantile_over_time(0.5, kvwatch_preemptions_per_second[5m]) > 99",
     ["a preemption pause inside one saturation is held"]),
    ("the bottleneck's hold only while firing",
     'and on (instance, job, model_name, engine)\n'
     '              ALERTS{alertname="KVCacheBottleneck", alertstate="firing"}',
     "", ["a queue that comes and goes every two minutes never completes the for"]),
    ("the bottleneck's hold letting go of a restarted engine", 'kvwatch_state{state="warming_up"}[2m]) == 1)\n    ',
     'kvwatch_state{state="nothing"}[2m]) == 1)\n    ',
     ["a page about a restarted or replaced engine ends with its last polls"]),
    ("the stall's silence where kvwatch names the cause", 'finding=~"request_exceeds_pool|kv_usage_stuck"',
     'finding=~"nothing"', ["a stall kvwatch has named the cause of pages once"]),
    ("the stall's state read over the window", 'last_over_time(kvwatch_state{state="stalled"}[2m]) == 1)\n'
     "            unless", '(kvwatch_state{state="stalled"}) == 1)\n            unless',
     ["a stalled engine pages through failed scrapes"]),
    ("the bottleneck's median", "quantile_over_time(0.5, kvwatch_kv_usage_ratio[2m]) >= 0.95",
     "max_over_time(kvwatch_kv_usage_ratio[2m]) >= 0.95",
     ["draining caches with requests still waiting resolve or never fire"]),
    ("the forecast's hand-off to bottleneck", 'kvwatch_state{state=~"filling|bottleneck"}',
     'kvwatch_state{state="filling"}', ["forecast stays firing through bottleneck until KVCacheBottleneck"]),
    ("absent's job regex", "absent(kvwatch_build_info{job=~\".*kvwatch.*\"})", "absent(kvwatch_build_info)",
     ["absent fires when no kvwatch reports under a kvwatch job"]),
    ("target down's wait for a model load", "for: 35m", "for: 10m",
     ["a slow model load during a rollout does not fire target down"]),
    # A guard or condition of one rule only: the old text takes in the lines around it.
    ("the scheduler alert's guard",
     '(last_over_time(kvwatch_state{state="scheduler_limited"}[2m]) == 1)\n          )\n'
     "          and on (instance, job) (max_over_time(kvwatch_up[2m]) == 1 or",
     '(last_over_time(kvwatch_state{state="scheduler_limited"}[2m]) == 1)\n          )\n'
     "          and on (instance, job) (max_over_time(kvwatch_up[2m]) >= 0 or",
     ["stale sidecar fires neither stalled nor scheduler-limited"]),
    ("the scheduler alert following kvwatch's state",
     '(last_over_time(kvwatch_state{state="scheduler_limited"}[2m]) == 1)',
     '(last_over_time(kvwatch_state{state=~".+"}[2m]) >= 0)',
     ["a sleeping engine's queue is not scheduler-limited",
      "a queue the next prompt does not fit is not scheduler-limited"]),
    ("the bottleneck's hold on the state below 0.95",
     'avg_over_time(kvwatch_state{state="bottleneck"}[5m]) >= 0.5',
     'avg_over_time(kvwatch_state{state="bottleneck"}[5m]) >= 99',
     ["a long-context bottleneck below 0.95 whose queue drains between bursts pages once"]),
    ("the request-exceeds-pool alert's guard",
     '{finding="request_exceeds_pool"}[2m]) == 1\n          )\n'
     "          and on (instance, job) (max_over_time(kvwatch_up[2m]) == 1 or",
     '{finding="request_exceeds_pool"}[2m]) == 1\n          )\n'
     "          and on (instance, job) (max_over_time(kvwatch_up[2m]) >= 0 or",
     ["no capacity alert while kvwatch is down"]),
    ("target down since start's silence after a good poll",
     "last_over_time(kvwatch_up[2m]) == 0\n"
     "          unless on (instance, job) last_over_time(kvwatch_last_success_timestamp_seconds[2m])",
     "last_over_time(kvwatch_up[2m]) == 0",
     ["a long outage after a good poll fires only since last_success"]),
    ("the bottleneck state branch's queue",
     '(min_over_time(kvwatch_state{state="bottleneck"}[2m]) == 1)\n'
     "              and on (instance, job, model_name, engine)\n"
     "              (quantile_over_time(0.5, kvwatch_requests_waiting[2m]) > 0)",
     '(min_over_time(kvwatch_state{state="bottleneck"}[2m]) == 1)',
     ["below 0.95 a bottleneck state without a queue or not held through the window does not fire"]),
    ("the bottleneck state held through the window", 'min_over_time(kvwatch_state{state="bottleneck"}[2m])',
     'max_over_time(kvwatch_state{state="bottleneck"}[2m])',
     ["below 0.95 a bottleneck state without a queue or not held through the window does not fire"]),
    ("the stall's requests in flight", "* 0\n              )\n            ) > 0",
     "* 0\n              )\n            ) >= 0",
     ["a stalled engine without a waiting gauge pages for its running requests, one with none in flight does not"]),
    ("the stall's missing waiting gauge counted as 0",
     "(\n                last_over_time(kvwatch_requests_waiting[2m])\n"
     "                or on (instance, job, model_name, engine) last_over_time(kvwatch_requests_running[2m]) * 0\n"
     "              )\n              +",
     "last_over_time(kvwatch_requests_waiting[2m]) +",
     ["a stalled engine without a waiting gauge pages for its running requests, one with none in flight does not"]),
    ("the stall's missing running gauge counted as 0",
     "+ (\n                last_over_time(kvwatch_requests_running[2m])\n"
     "                or on (instance, job, model_name, engine) last_over_time(kvwatch_requests_waiting[2m]) * 0\n"
     "              )",
     "+ last_over_time(kvwatch_requests_running[2m])",
     ["a stalled engine without a running gauge pages for its waiting requests"]),
    ("the GPU memory horizon", "kvwatch_gpu_memory_limit_eta_seconds < 1800\n",
     "kvwatch_gpu_memory_limit_eta_seconds < 3600\n",
     ["just below 30 minutes to the limit fires, 30 minutes does not"]),
    ("the GPU memory horizon's strict bound", "kvwatch_gpu_memory_limit_eta_seconds < 1800\n",
     "kvwatch_gpu_memory_limit_eta_seconds <= 1800\n",
     ["just below 30 minutes to the limit fires, 30 minutes does not"]),
    ("the GPU gauge held only while the GPU is not read",
     "unless on (instance, job, uuid, gpu_instance) kvwatch_gpu_memory_used_bytes",
     "unless on (instance, job, uuid, gpu_instance) kvwatch_gpu_memory_used_bytes > 1e99",
     ["growth that stopped before the for does not fire"]),
    ("the GPU gauge held per GPU", "unless on (instance, job, uuid, gpu_instance) kvwatch_gpu_memory_used_bytes",
     "unless on (instance, job) kvwatch_gpu_memory_used_bytes",
     ["GPU memory pressure warns through failed GPU reads and failed scrapes"]),
    ("the TTFT breach held only while its series is not read",
     'unless on (instance, job, model_name, engine) (kvwatch_state{state="unknown"} == 0)',
     'unless on (instance, job, model_name, engine) (kvwatch_state{state="unknown"} == 2)',
     ["a breach whose p90 went unknown before the for does not fire"]),
    ("the TTFT breach held while its series is missing from a poll",
     'unless on (instance, job, model_name, engine) (kvwatch_state{state="unknown"} == 0)',
     'unless on (instance, job, model_name, engine) (kvwatch_state{state=~"unknown|ok"} >= 0)',
     ["a breach holds through a poll its engine's series is missing from"]),
    ("target down read over the window", "and on (instance, job) (last_over_time(kvwatch_up[2m]) == 0)",
     "and on (instance, job) (kvwatch_up == 0)", ["target down warns through failed scrapes of the sidecar"]),
    ("the GPU source's guard over the window", "(max_over_time(kvwatch_gpu_source_up[2m]) == 1)",
     "(kvwatch_gpu_source_up == 1)", ["GPU memory pressure warns through failed GPU reads and failed scrapes"]),
    ("kvwatch's restart count", '{container=~"kvwatch"}[2h]) >= 3', '{container=~"kvwatch"}[2h]) > 3',
     ["kvwatch restarting 3 times fires, and resolves half an hour after the last"]),
    ("vLLM's restart count over 30 minutes (a slow loop)", '{container=~"vllm"}[2h]) >= 3',
     '{container=~"vllm"}[30m]) >= 3', ["a slow crash loop, a restart every 15 minutes, fires"]),
    ("the last restart within 30 minutes", '{container=~"kvwatch"}[30m]) > 0', '{container=~"kvwatch"}[30m]) >= 0',
     ["kvwatch restarting 3 times fires, and resolves half an hour after the last"]),
]


@pytest.mark.parametrize(("what", "old", "new", "failing"), MUTATIONS, ids=[m[0] for m in MUTATIONS])
def test_promtool_unit_tests_catch_a_broken_rule(tmp_path: Path, what: str, old: str, new: str,
                                                  failing: list[str]) -> None:
    """The unit tests are not vacuous: the same tests against a pack with one condition broken must fail, in
    the cases written for that condition."""
    source = RULES.read_text()
    assert old in source, f"mutation for {what} no longer applies"
    (tmp_path / "tests").mkdir()
    for test in RULE_TESTS:
        (tmp_path / "tests" / test.name).write_text(test.read_text())
    (tmp_path / "kvwatch-rules.yaml").write_text(source.replace(old, new))
    result = subprocess.run(
        [promtool(), "test", "rules", *sorted(map(str, (tmp_path / "tests").glob("*.yaml")))],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode != 0, f"no promtool case notices a broken {what}"
    for name in failing:
        assert f"name: {name}" in result.stdout + result.stderr, f"{name!r} did not notice a broken {what}"


def test_pack_has_exactly_the_contract_alerts() -> None:
    assert {rule["alert"] for rule in alert_rules()} == set(ALERTS)


def rule_id(rule: dict) -> str:
    return rule["alert"] + (f"[since={rule['labels']['since']}]" if "since" in rule.get("labels", {}) else "")


@pytest.mark.parametrize("rule", alert_rules(), ids=rule_id)
def test_every_alert_has_for_severity_and_annotations(rule: dict) -> None:
    assert parse_duration(rule["for"]) >= 60
    assert rule["labels"]["severity"] == ALERTS[rule["alert"]]
    assert set(rule["labels"]) == {"severity"} | EXTRA_LABELS.get(rule["alert"], set())
    annotations = rule["annotations"]
    assert set(annotations) == {"summary", "description", "runbook_url"}
    if (rule["alert"], rule["labels"].get("since")) not in CONSTANT_VALUE:
        assert "$value" in annotations["description"]
    if rule["alert"] not in NO_MODEL:
        assert "$labels.model_name" in annotations["description"]
    assert "$labels.pod" in annotations["description"]


def test_target_down_waits_out_the_charts_startup_budget_only_before_the_first_good_poll() -> None:
    """A model load (the chart's vLLM startupProbe allows it) must not fire KvwatchTargetDown on every rollout;
    a vLLM lost after kvwatch had read it fires sooner. The texts quote the same numbers."""
    rules = {r["labels"]["since"]: r for r in alert_rules() if r["alert"] == "KvwatchTargetDown"}
    assert set(rules) == {"last_success", "start"}
    probe = yaml.safe_load(CHART_VALUES.read_text())["vllm"]["startupProbe"]
    budget = probe["periodSeconds"] * probe["failureThreshold"]
    lost, start = parse_duration(rules["last_success"]["for"]), parse_duration(rules["start"]["for"])
    assert lost < budget < start
    assert "kvwatch_last_success_timestamp_seconds" in rules["last_success"]["expr"]
    unless = "unless on (instance, job) last_over_time(kvwatch_last_success_timestamp_seconds[2m])"
    assert unless in rules["start"]["expr"]
    text = " ".join(rules["start"]["annotations"]["description"].split())
    assert f"in the {start / 60:.0f} minutes since it started" in text
    assert f"the chart's startupProbe allows {budget / 60:.0f} minutes" in text


@pytest.mark.parametrize("rule", alert_rules(), ids=rule_id)
def test_runbook_url_points_to_an_existing_section(rule: dict) -> None:
    url = rule["annotations"]["runbook_url"]
    assert url.startswith("https://") and "/docs/runbooks.md#" in url
    anchor = url.rsplit("#", 1)[1]
    headings = re.findall(r"^#{2,3} (.+)$", RUNBOOKS.read_text(), flags=re.MULTILINE)
    anchors = {re.sub(r"[^a-z0-9 _-]", "", h.strip().lower()).replace(" ", "-") for h in headings}
    assert anchor == rule["alert"].lower()
    assert anchor in anchors, f"docs/runbooks.md has no section for #{anchor}"


@pytest.mark.parametrize("rule", alert_rules(), ids=rule_id)
def test_alerts_on_derived_gauges_are_guarded_by_kvwatch_up(rule: dict) -> None:
    expr = rule["expr"]
    if DERIVED.search(expr):
        assert GUARD.search(expr.strip()), f"{rule['alert']} reads derived gauges without the kvwatch_up guard"


def test_runbooks_say_how_to_act_in_mode_2() -> None:
    """kvwatch alone: the alert's pod is kvwatch's, so `kubectl exec POD -c kvwatch -- kvwatch check
    http://127.0.0.1:8000/metrics` and `logs POD -c vllm` would miss. The runbooks give the mode-2 forms."""
    text = RUNBOOKS.read_text()
    assert "vllm_target" in text
    assert "kubectl -n NS exec POD -c kvwatch -- kvwatch check VLLM_TARGET" in text
    assert "VLLM_POD" in text
    for rule in alert_rules():  # every text on kvwatch's series can name the watched vLLM
        assert ("$labels.vllm_target" in rule["annotations"]["description"]) == (rule["alert"] not in KUBE_STATE), \
            rule_id(rule)


def test_recording_rules_follow_level_metric_operation() -> None:
    records = [rule for rule in load_rules() if "record" in rule]
    assert len(records) >= 8
    for rule in records:
        assert RECORD_NAME.match(rule["record"]), rule["record"]
        level = rule["record"].split(":")[0]
        labels = level.replace("_model_name", ", model_name")
        labels = labels.replace("_state", ", state").replace("_horizon", ", horizon")
        assert f"by ({labels})" in rule["expr"]


def test_every_alert_has_a_firing_and_a_silent_promtool_case() -> None:
    fired: set[str] = set()
    silent: set[str] = set()
    for path in RULE_TESTS:
        for case in yaml.safe_load(path.read_text())["tests"]:
            for check in case.get("alert_rule_test", []):
                (fired if check.get("exp_alerts") else silent).add(check["alertname"])
    assert fired == set(ALERTS)
    assert silent == set(ALERTS)


def test_e2e_copy_differs_only_in_shorter_for() -> None:
    source = RULES.read_text()
    copy = shorten_for(source, 60)
    assert differences_besides_for(source, copy) == []
    long, short = for_durations(source), for_durations(copy)
    assert long.keys() == short.keys()
    for name in long:
        assert all(s < lg for s, lg in zip(short[name], long[name], strict=True)), name
    # the hold through a failed poll is shortened with the `for`s: 1m -> 1s at x60 (and the restart loops' 2m through
    # a missed kube-state-metrics scrape, 2s)
    held = [line.strip() for line in copy.splitlines() if line.strip().startswith("keep_firing_for:")]
    assert held and set(held) == {"keep_firing_for: 1s", "keep_firing_for: 2s"}


def test_every_guarded_alert_holds_through_a_failed_poll() -> None:
    # One poll that fails (kvwatch_up 0 for an interval) must not resolve a firing alert (alerts/config.yaml,
    # guard_hold); alerts/tests/forecast.test.yaml shows it in promtool.
    for group in yaml.safe_load(RULES.read_text())["groups"]:
        for rule in group["rules"]:
            # (the GPU memory alert's guard is its GPU source's own up: one failed dcgm/NVML read drops the gauges)
            guards = ("(max_over_time(kvwatch_up[2m]) == 1 or", "(max_over_time(kvwatch_gpu_source_up[2m]) == 1)")
            if "alert" in rule and any(guard in rule["expr"] for guard in guards):
                # (KVCacheBottleneck's longer hold is in its expression: it lets go of a crashed engine)
                assert rule.get("keep_firing_for") == "1m", rule["alert"]


# Gauges kvwatch withdraws when their condition is over, read at the instant beside a hold over the guard's window
# that applies only while they cannot be read (the clause): held after a recovery, they fired late alerts.
HELD_WHILE_UNREAD = {
    "kvwatch_gpu_memory_limit_eta_seconds":
        "unless on (instance, job, uuid, gpu_instance) kvwatch_gpu_memory_used_bytes",
    "kvwatch_ttft_slo_breach": 'unless on (instance, job, model_name, engine) (kvwatch_state{state="unknown"} == 0)',
}


def test_every_alert_reads_kvwatchs_gauges_over_the_guards_window() -> None:
    # A failed Prometheus scrape of the sidecar marks every series stale; a gauge read at the instant then restarted
    # the `for` (one failed scrape in 4 kept VLLMEngineStalled from ever firing). Every kvwatch
    # series an alert reads is read over a range (last_over_time, or the window functions), or is one of
    # HELD_WHILE_UNREAD with its hold and its clause.
    selector = re.compile(r"\b(kvwatch_[a-z_]+)(\{[^}]*\})?(.)?")
    for group in yaml.safe_load(RULES.read_text())["groups"]:
        for rule in group["rules"]:
            if "alert" not in rule or rule["alert"] == "KvwatchAbsent":
                continue  # (Prometheus' own `up` and absent(): about the scrape itself)
            expr = rule["expr"]
            held = {name for name, clause in HELD_WHILE_UNREAD.items()
                    if f"last_over_time({name}" in expr and clause in expr}
            for name in held:
                expr = expr.replace(HELD_WHILE_UNREAD[name], "")
            instants = [m.group(1) for m in selector.finditer(expr) if m.group(3) != "[" and m.group(1) not in held]
            assert not instants, (rule["alert"], instants)


def test_difference_check_catches_a_changed_threshold() -> None:
    source = RULES.read_text()
    tampered = shorten_for(source, 60).replace('{horizon="30m"}', '{horizon="15m"}')
    assert differences_besides_for(source, tampered) == ["rule KVCacheExhaustionForecast differs"]


def _generator():  # alerts/generate.py is a script, not part of the package
    return load_script("alerts/generate.py", "generate_rules")


def test_shipped_rules_are_generated_from_the_config() -> None:
    """alerts/kvwatch-rules.yaml and the chart's copy are exactly what alerts/generate.py writes from
    alerts/config.yaml and alerts/rules.in.yaml: an edit to the YAML alone, or a config change not regenerated,
    fails here."""
    generator = _generator()
    text = generator.generate()
    for path in generator.OUTPUTS:
        assert path.read_text() == text, f"{path.relative_to(ROOT)} is stale: run .venv/bin/python alerts/generate.py"
    assert generator.main(["--check"]) == 0


def test_a_knob_changes_every_place_that_quotes_it(tmp_path: Path) -> None:
    """One number in the config moves the expression, the `for` and the texts that quote them together."""
    generator = _generator()
    config = yaml.safe_load(generator.CONFIG.read_text())
    config["scheduler_limited"].update(usage_below=0.85, **{"for": "15m"})
    config["selectors"]["kvwatch_job"] = 'job="kvwatch-sidecar"'
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    rules = {r.get("alert"): r for g in yaml.safe_load(generator.generate(tmp_path / "config.yaml"))["groups"]
             for r in g["rules"]}
    limited = rules["VLLMSchedulerLimited"]
    assert "< 0.85)" in limited["expr"] and limited["for"] == "15m"
    text = " ".join(limited["annotations"]["description"].split())
    assert "for 15 minutes while its KV cache stayed below 85%" in text
    absent = rules["KvwatchAbsent"]["expr"]
    assert 'up{job="kvwatch-sidecar"} == 0' in absent and 'avg_over_time(up{job="kvwatch-sidecar"}[10m])' in absent
    assert 'absent(kvwatch_build_info{job="kvwatch-sidecar"}) unless on () (up{job="kvwatch-sidecar"} == 0)' in absent


def test_generator_refuses_unknown_and_unused_knobs(tmp_path: Path) -> None:
    generator = _generator()
    template = generator.TEMPLATE.read_text()
    (tmp_path / "typo.yaml").write_text(template.replace("${bottleneck.usage}", "${bottleneck.usgae}"))
    with pytest.raises(generator.ConfigError, match=r"bottleneck\.usgae"):
        generator.generate(template_path=tmp_path / "typo.yaml")
    config = yaml.safe_load(generator.CONFIG.read_text())
    config["bottleneck"]["forgotten"] = 1
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    with pytest.raises(generator.ConfigError, match=r"bottleneck\.forgotten"):
        generator.generate(tmp_path / "config.yaml")
