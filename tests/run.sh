#!/usr/bin/env bash
# The whole test suite on a fresh Debian machine: installs dependencies, then runs the CI gates
# (format, clippy with warnings denied with and without the cuda feature, every Rust test of the
# workspace against ../shared/media),
# then the deploy/ files (tests/deploy.sh), the Python client's suite (tests/python.sh), and the reference
# benchmark's driver on a tiny corpus as a pixel cross-check against PyAV and decord (tests/bench_smoke.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
tests/deps.sh
cargo fmt --all --check
cargo clippy --workspace --all-targets -- -D warnings
# The cuda feature is on by default; the build without it must compile (and lint) too.
cargo clippy --workspace --all-targets --no-default-features -- -D warnings
cargo test --workspace
tests/deploy.sh
tests/python.sh
tests/bench_smoke.sh
