#!/usr/bin/env bash
# Create .venv and install sentemb with CPU torch 2.13.0 (pinned: its wheel is local on the dev/CI machines;
# on a GPU machine install the CUDA build of torch first, then run this script).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -d .venv ] || "$PY" -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
# TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu picks the small CPU wheel where PyPI's default
# would be a CUDA build (on the project's dev/CI machines the pinned wheel is already on disk).
python -c "import torch" 2>/dev/null || python -m pip install -q "torch==2.13.0" ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"}
# sentemb and its dependencies through uv where uv installs (about 10 s against pip's 54 s on the project's
# 2-core machine), held to pip's own resolution (scripts/constraints.txt; torch stays the one installed
# above), else, or if uv fails, through pip
if python -m pip install -q uv; then
  python -m uv pip install -q --python "$(command -v python)" -c scripts/constraints.txt -e ".[test,bench,slurm]" \
    || python -m pip install -q -e ".[test,bench,slurm]"
else
  python -m pip install -q -e ".[test,bench,slurm]"
fi
# Bytecode for every installed module and for sentemb's own sources (an editable install). uv installs
# without it, and where PYTHONDONTWRITEBYTECODE is set (as on the project's 2-core dev machine) no
# process writes it: each of a DAG's jobs then compiled transformers, mlflow and the rest from source,
# about 2 s a process (sentemb evaluate: 8.4 -> 5.7 s on the tiny DAG's model). Files already compiled
# are skipped; a few template files in site-packages are not Python and fail quietly.
python -m compileall -q -j 0 "$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" src \
  >/dev/null 2>&1 || true
