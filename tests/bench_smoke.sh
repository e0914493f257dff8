#!/usr/bin/env bash
# The reference benchmark's driver (benches/reference.py) on a tiny corpus, as a correctness check rather
# than a measurement: vserve's train stream and full-video GetClips must deliver, for the same clips, crops
# and flips, exactly the pixels that PyAV and decord (each with its own bundled FFmpeg) decode
# independently with frame-exact seeking; and every system must deliver every clip. No timing is asserted.
# Installs the peers into target/bench-venv (benches/requirements.txt); uses the debug daemon, no floor.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --quiet --bin vserve
venv=target/bench-venv
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/pip" install -q --disable-pip-version-check -r benches/requirements.txt ./clients/python
out=target/bench-results/smoke
rm -rf "$out"
mkdir -p "$out"
"$venv/bin/python" benches/reference.py run --variants gop250 --clips 12 --full-videos 2 \
  --workloads train,steady,full --steady-cache 4M --systems vserve,pyav,decord --no-floor \
  --vserve-bin target/debug/vserve --out "$out" > "$out/driver.log" 2>&1 || { tail -40 "$out/driver.log"; exit 1; }
"$venv/bin/python" tests/bench_check.py "$out/results.json"
