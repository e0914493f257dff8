#!/usr/bin/env bash
# The GulpIO reference implementation for tests/gulp.rs and the gulp benchmark: a virtualenv under
# target/gulp-venv with pinned gulpio2 (and its JPEG library simplejpeg) from PyPI. Idempotent; prints the
# interpreter's path.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=target/gulp-venv
stamp=$venv/.vserve-gulp-1
if [ ! -f "$stamp" ]; then
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check gulpio2==0.0.4 simplejpeg==1.9.0 numpy >&2
  touch "$stamp"
fi
echo "$PWD/$venv/bin/python"
