#!/usr/bin/env bash
# The scale benchmark (benches/scale.py, issue 15; not in CI): the release daemon on N hard links of one
# real clip. Installs the Python client into target/py-venv, builds the release daemon, runs the driver:
#   benches/scale.sh --n 100000 [--per-dir 1000] [--tables 1000] [--keep]
# VSERVE_BIN picks another daemon binary.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=target/py-venv
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
pip=("$venv/bin/pip" install -q --disable-pip-version-check)
"${pip[@]}" ./clients/python
"${pip[@]}" --force-reinstall --no-deps ./clients/python
[ -n "${VSERVE_BIN:-}" ] || cargo build --release --quiet --bin vserve
exec "$venv/bin/python" benches/scale.py "$@"
