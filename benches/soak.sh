#!/usr/bin/env bash
# Soak benchmark of issue 13 ("a shared daemon no tenant can take down"): builds the release daemon,
# makes the Python client's virtualenv (target/py-venv, pinned as tests/python.sh makes it) and runs
# benches/soak.py, which starts the daemon over /work/shared/media with its own --shm-dir and
# --state-dir and runs 64 stream clients, a GetClips flood, SIGKILL chaos and a byte-exact control
# client against it. Arguments go to soak.py (--duration 300, --out target/soak, ...; --help).
# Exit 1 if the daemon died, a control reply changed, or arenas were left.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --quiet --release --bin vserve
venv=target/py-venv
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
pip=("$venv/bin/pip" install -q --disable-pip-version-check)
"${pip[@]}" -r clients/python/requirements-dev.txt ./clients/python
"${pip[@]}" --force-reinstall --no-deps ./clients/python
exec "$venv/bin/python" benches/soak.py --bin target/release/vserve "$@"
