"""The inhibition docs/alerts.md suggests, in a real Alertmanager: which alerts it mutes and which it must not.

The ``inhibit_rules`` block is read from the doc itself, so the doc cannot drift from what was tested. Alerts are
posted straight to Alertmanager's API (the rules that raise them are promtool's to test) and their state read
back: ``suppressed`` with the alert that inhibits it, or ``active``.
"""

from __future__ import annotations

import json
import re
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.harness import LOOPBACK, Process, free_port, get_json, require_binary, wait_until_ready

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[1]


def documented_inhibit_rules() -> list[dict[str, Any]]:
    text = (ROOT / "docs" / "alerts.md").read_text()
    block = re.search(r"```yaml\n(\s*inhibit_rules:.*?)```", text, re.S)
    assert block, "docs/alerts.md has no inhibit_rules block"
    return yaml.safe_load(block.group(1).replace("\n  ", "\n"))["inhibit_rules"]


def _alert(name: str, instance: str, **labels: str) -> dict[str, Any]:
    return {"labels": {"alertname": name, "instance": instance, "job": "kvwatch", **labels}}


def _post(url: str, alerts: list[dict[str, Any]]) -> None:
    request = urllib.request.Request(f"{url}/api/v2/alerts", data=json.dumps(alerts).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(request, timeout=5) as response:
        assert response.status == 200


def _states(url: str, expected: int, settle: float = 3.0) -> dict[tuple[str, str], str]:
    """(alertname, instance) -> Alertmanager's state, once all ``expected`` alerts are there and their states have
    not changed for ``settle`` seconds: the inhibitor learns of source alerts from a subscription, after the API has
    them, so the first listing can show a target still "active" (seen on a loaded CI machine)."""
    deadline = time.monotonic() + 30
    last: dict[tuple[str, str], str] | None = None
    since = time.monotonic()
    while True:
        alerts = get_json(f"{url}/api/v2/alerts")
        states = {(a["labels"]["alertname"], a["labels"]["instance"]): a["status"]["state"] for a in alerts}
        if states != last:
            last, since = states, time.monotonic()
        settled = len(alerts) >= expected and time.monotonic() - since >= settle
        if settled or time.monotonic() > deadline:
            return states
        time.sleep(0.2)


def test_documented_inhibition_mutes_only_the_same_target(tmp_path: Path) -> None:
    port = free_port()
    config = {"route": {"receiver": "null"}, "receivers": [{"name": "null"}],
              "inhibit_rules": documented_inhibit_rules()}
    (tmp_path / "am.yml").write_text(yaml.safe_dump(config))
    am = Process("alertmanager", [
        require_binary("prometheus-alertmanager"), f"--config.file={tmp_path / 'am.yml'}",
        f"--storage.path={tmp_path / 'data'}", f"--web.listen-address={LOOPBACK}:{port}",
        "--cluster.listen-address=",
    ], tmp_path)
    url = f"http://{LOOPBACK}:{port}"
    try:
        wait_until_ready(f"{url}/-/ready", am, 30)
        engine = {"model_name": "llama", "engine": "0"}
        _post(url, [
            # host-a's vLLM is unreadable; static targets: no namespace, no pod on any alert
            _alert("KvwatchTargetDown", "host-a:9747", since="last_success"),
            _alert("KVCacheBottleneck", "host-a:9747", **engine),
            _alert("VLLMContainerRestartLoop", "host-a:9747", container="vllm"),
            # host-b is saturated: its page must get through
            _alert("KVCacheBottleneck", "host-b:9747", **engine),
            _alert("KVCacheExhaustionForecast", "host-b:9747", **engine),
            _alert("TTFTObjectiveBreach", "host-b:9747", **engine),  # its runbook: follow KVCacheBottleneck
            # host-c's forecast and TTFT: host-b's bottleneck is not their own
            _alert("KVCacheExhaustionForecast", "host-c:9747", **engine),
            _alert("TTFTObjectiveBreach", "host-c:9747", **engine),
        ])
        states = _states(url, 8)
    finally:
        am.stop()
    assert states == {
        ("KvwatchTargetDown", "host-a:9747"): "active",
        ("KVCacheBottleneck", "host-a:9747"): "suppressed",  # its own target is down
        ("VLLMContainerRestartLoop", "host-a:9747"): "active",  # never muted by the warning it causes
        ("KVCacheBottleneck", "host-b:9747"): "active",  # another host's TargetDown mutes nothing here
        ("KVCacheExhaustionForecast", "host-b:9747"): "suppressed",  # the hand-off to its own bottleneck
        ("TTFTObjectiveBreach", "host-b:9747"): "suppressed",  # one incident, one notification
        ("KVCacheExhaustionForecast", "host-c:9747"): "active",
        ("TTFTObjectiveBreach", "host-c:9747"): "active",
    }
