#!/usr/bin/env bash
# The demo: on a fresh Debian machine, builds vserve, starts the daemon serving the built-in demo dataset
# (tests/data/demo: three small real clips) on a private Unix socket, and runs a client that reads
# batches from it (cargo example `demo` of the Rust client), the CLI's probe and get, and a training
# stream (vserve stream: sampled, augmented batches through shared memory). Stops the
# daemon with SIGTERM at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
tests/deps.sh
cargo build --release --bin vserve --example demo -p vserve -p vserve-client
run_dir=$(mktemp -d)
sock="$run_dir/vserve.sock"
# Admin endpoints (/metrics, /livez, /readyz) on an ephemeral local port, never clashing with another daemon.
target/release/vserve --listen "unix:$sock" --dataset "demo=$PWD/tests/data/demo" --cache-bytes 512MiB \
  --admin-listen 127.0.0.1:0 &
daemon=$!
trap 'kill -TERM $daemon 2>/dev/null; wait $daemon 2>/dev/null; rm -rf "$run_dir"' EXIT
for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.1; done
target/release/examples/demo "unix:$sock" demo nasa_13013.mp4 flipping_a_pancake.mkv chaplin.mp4
echo "--- vserve probe / vserve get"
target/release/vserve probe --addr "unix:$sock" --dataset demo --video flipping_a_pancake.mkv
target/release/vserve get --addr "unix:$sock" --dataset demo --video nasa_13013.mp4 --times 6.006,10.01 --out "$run_dir/nasa.npy"
echo "--- a training stream: rank 0 of 2, server-side sampling and augmentation, batches through shared memory"
target/release/vserve stream --addr "unix:$sock" --dataset demo --clips-per-video 4 --frames-per-clip 8 \
  --frame-stride 4 --short-side 128 --random-crop 112x112 --random-flip --batch-size 4 --seed 0 --epoch 0 \
  --rank 0 --world-size 2 --out-dir "$run_dir/batches"
echo "--- a bad request gets a status, and the daemon keeps serving"
target/release/vserve get --addr "unix:$sock" --dataset demo --video ../etc/passwd --frames 0 --out "$run_dir/x.npy" || true
target/release/vserve stats --addr "unix:$sock"
