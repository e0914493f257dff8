#!/usr/bin/env bash
# Installs what building and testing vserve needs on a fresh Debian (bookworm) machine: FFmpeg's
# development libraries (ffmpeg-next binds them), clang for bindgen, the ffmpeg CLI (the tests' reference
# oracle), systemd-analyze and a Python venv for the deploy/ checks (tests/deploy.sh), and checks for a
# Rust toolchain. Idempotent; quiet when everything is present.
set -euo pipefail
need=()
for pkg in libavformat-dev libavcodec-dev libavutil-dev libswscale-dev pkg-config libclang-dev clang ffmpeg ca-certificates systemd python3 python3-venv; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  echo "deps: installing ${need[*]}" >&2
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
if ! command -v cargo >/dev/null 2>&1; then
  [ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"
fi
command -v cargo >/dev/null 2>&1 || { echo "deps: cargo not found; install Rust (https://rustup.rs)" >&2; exit 1; }
# The Python client's tests (tests/run.sh builds a virtualenv): python3 with venv and ensurepip.
if ! python3 -c 'import venv, ensurepip' >/dev/null 2>&1; then
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  echo "deps: installing python3 python3-venv" >&2
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends python3 python3-venv >/dev/null
fi
# GulpIO datasets (src/gulp/jpeg.rs link libjpeg-turbo's TurboJPEG library).
if ! dpkg -s libturbojpeg0-dev >/dev/null 2>&1; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  echo "deps: installing libturbojpeg0-dev" >&2
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends libturbojpeg0-dev >/dev/null
fi
