#!/usr/bin/env bash
# The whole test suite on a fresh Debian machine: installs dependencies, then runs the CI gates
# (format, clippy with warnings denied, every Rust test of the workspace against ../shared/media),
# then the deploy/ files (tests/deploy.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
tests/deps.sh
cargo fmt --all --check
cargo clippy --workspace --all-targets -- -D warnings
cargo test --workspace
tests/deploy.sh
tests/python.sh
