#!/usr/bin/env bash
# Checks the deployment files under deploy/:
# - systemd: `systemd-analyze verify` on the unit (ExecStart pointed at the built binary), with no
#   warning allowed; a misspelt directive must be reported (proves the check is live);
# - Kubernetes: every manifest against the Kubernetes JSON schemas, strictly (unknown fields rejected),
#   with kubernetes-validate from PyPI (it bundles the schemas: no network at check time); a broken
#   manifest must be rejected;
# - the example configurations (systemd vserve.toml, the ConfigMap's vserve.toml) through `vserve config`;
# - the Grafana dashboard is JSON (its metric names are checked against /metrics by tests/ops.rs).
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "deploy: $*" >&2; exit 1; }

cargo build --quiet --bin vserve
bin=$PWD/target/debug/vserve

# systemd
sed "s#/usr/local/bin/vserve#$bin#" deploy/systemd/vserve.service >"$tmp/vserve.service"
out=$(systemd-analyze verify "$tmp/vserve.service" 2>&1) || fail "systemd-analyze verify failed: $out"
[ -z "$out" ] || fail "systemd-analyze verify warned: $out"
sed 's/^ProtectSystem=/ProtectSytem=/' "$tmp/vserve.service" >"$tmp/broken.service"
out=$(systemd-analyze verify "$tmp/broken.service" 2>&1 || true)
grep -q "Unknown key 'ProtectSytem'" <<<"$out" || fail "systemd-analyze missed a broken unit: $out"
grep -Eq '^TimeoutStopSec=([0-9]+)' deploy/systemd/vserve.service || fail "no TimeoutStopSec"
stop=$(sed -n 's/^TimeoutStopSec=\([0-9]*\).*/\1/p' deploy/systemd/vserve.service)
grace=$(sed -n 's/^shutdown-grace = \([0-9]*\).*/\1/p' deploy/systemd/vserve.toml)
[ "$stop" -gt "$grace" ] || fail "TimeoutStopSec ($stop) must exceed shutdown-grace ($grace)"
# The example config (the group exists only once vserve.sysusers.conf is applied).
grep -v '^socket-group' deploy/systemd/vserve.toml >"$tmp/vserve.toml"
"$bin" config --config "$tmp/vserve.toml" >/dev/null || fail "deploy/systemd/vserve.toml is invalid"

# Kubernetes
venv=target/deploy-venv
if [ ! -x "$venv/bin/kubernetes-validate" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check 'kubernetes-validate==1.37.0'
fi
"$venv/bin/kubernetes-validate" --strict --quiet deploy/k8s/*.yaml || fail "Kubernetes manifests invalid"
sed 's/containerPort: 9464/containerPort: "9464"/; s/^      volumes:/      volumez:/' deploy/k8s/daemonset.yaml >"$tmp/broken.yaml"
if "$venv/bin/kubernetes-validate" --strict --quiet "$tmp/broken.yaml" >/dev/null 2>&1; then
  fail "kubernetes-validate accepted a broken manifest"
fi
"$venv/bin/python" - "$tmp/cm.toml" <<'PY'
import sys, yaml
docs = yaml.safe_load_all(open("deploy/k8s/configmap.yaml"))
cm = next(d for d in docs if d and d.get("kind") == "ConfigMap")
open(sys.argv[1], "w").write(cm["data"]["vserve.toml"])
PY
"$bin" config --config "$tmp/cm.toml" >/dev/null || fail "the ConfigMap's vserve.toml is invalid"
grep -q 'terminationGracePeriodSeconds: 45' deploy/k8s/daemonset.yaml || fail "grace period changed: check it exceeds shutdown-grace"

# Grafana
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["panels"], "no panels"' deploy/grafana/vserve.json \
  || fail "deploy/grafana/vserve.json is not a dashboard"
echo "deploy: systemd unit, Kubernetes manifests, example configs and dashboard OK"
