#!/usr/bin/env bash
# Create .venv and install sentemb with CPU torch 2.13.0 (pinned: its wheel is local on the dev/CI machines;
# on a GPU machine install the CUDA build of torch first, then run this script).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -d .venv ] || "$PY" -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
python -c "import torch" 2>/dev/null || python -m pip install -q "torch==2.13.0"
python -m pip install -q -e ".[test,bench]"
