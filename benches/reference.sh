#!/usr/bin/env bash
# The reference benchmark (benches/reference.py): vserve against PyAV, decord (TorchCodec when installed in
# the venv) and FFmpeg's floor on DESIGN.md's workloads. Makes target/bench-venv with the pinned peers,
# builds the release daemon and the floor bench, then runs the driver with the arguments given:
#   benches/reference.sh run [--variants gop250] [--workloads train,warm] ...
#   benches/reference.sh open-loop [--rates 20,40,80] ...
set -euo pipefail
cd "$(dirname "$0")/.."
venv=target/bench-venv
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
pip=("$venv/bin/pip" install -q --disable-pip-version-check)
"${pip[@]}" -r benches/requirements.txt ./clients/python
cargo build --release --quiet --bin vserve
floor=$(cargo bench --bench floor --no-run --message-format=json 2>/dev/null |
  "$venv/bin/python" -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "floor" and m.get("executable"):
        print(m["executable"])')
export FLOOR_BIN="$floor"
exec "$venv/bin/python" benches/reference.py "$@"
