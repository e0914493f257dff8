#!/usr/bin/env bash
# The Python client's tests (clients/python/tests): installs the package into a virtualenv
# (target/py-venv) with the pinned test requirements, then runs pytest against the daemon binary
# (target/debug/vserve, built here if needed; VSERVE_BIN overrides) and ../shared/media.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${VSERVE_BIN:-}" ]; then
  cargo build --quiet --bin vserve
  export VSERVE_BIN="$PWD/target/debug/vserve"
fi
venv=target/py-venv
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
pip=("$venv/bin/pip" install -q --disable-pip-version-check)
"${pip[@]}" -r clients/python/requirements-dev.txt ./clients/python
"${pip[@]}" --force-reinstall --no-deps ./clients/python
"$venv/bin/python" -m pytest -q -rs clients/python/tests "$@"
