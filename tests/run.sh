#!/usr/bin/env bash
# The whole test suite on a fresh Debian machine: installs dependencies, then runs the CI gates
# (format, clippy with warnings denied, every Rust test of the workspace against ../shared/media).
set -euo pipefail
cd "$(dirname "$0")/.."
tests/deps.sh
cargo fmt --all --check
cargo clippy --workspace --all-targets -- -D warnings
cargo test --workspace
# The Python client (clients/python), installed into a virtualenv, against the daemon cargo test built.
venv=target/py-venv
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/pip" install -q --disable-pip-version-check -r clients/python/requirements-dev.txt ./clients/python
"$venv/bin/pip" install -q --disable-pip-version-check --force-reinstall --no-deps ./clients/python
VSERVE_BIN="$PWD/target/debug/vserve" "$venv/bin/python" -m pytest -q -rs clients/python/tests
