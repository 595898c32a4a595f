#!/usr/bin/env bash
# Copy the single sources of the alert rules and the Grafana dashboard into the Helm chart, which carries
# them in files/ (Helm can only read files inside the chart). tests/test_helm_chart.py fails when the
# copies drift, so run this after every change to alerts/kvwatch-rules.yaml or dashboards/kvwatch.json.
# Usage: scripts/sync-chart-files.sh [--check]   (--check: report drift, copy nothing, exit 1 if any)
set -euo pipefail
cd "$(dirname "$0")/.."

chart_files=deploy/helm/kvwatch/files
pairs=(
  "alerts/kvwatch-rules.yaml:$chart_files/kvwatch-rules.yaml"
  "dashboards/kvwatch.json:$chart_files/kvwatch.json"
)
check=false
[ "${1:-}" = "--check" ] && check=true

status=0
for pair in "${pairs[@]}"; do
  src=${pair%%:*}
  dst=${pair#*:}
  if [ ! -f "$src" ]; then
    echo "sync-chart-files: $src does not exist" >&2
    status=1
    continue
  fi
  if cmp -s "$src" "$dst"; then
    echo "up to date: $dst"
  elif $check; then
    echo "out of date: $dst (differs from $src)" >&2
    status=1
  else
    mkdir -p "$(dirname "$dst")"
    cp "$src" "$dst"
    echo "copied: $src -> $dst"
  fi
done
exit $status
