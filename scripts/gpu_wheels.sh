#!/usr/bin/env bash
# Fetch, into .whl/ (git-ignored), the wheels scripts/gpu_check.sh installs on a lent GPU machine: the
# packages omrl needs that its image (Python 3.12, torch, transformers, accelerate, pytest) lacks, and
# setuptools to install omrl itself. That machine reaches no package registry; the wheels travel with
# the working tree (`carry: [".whl"]`).
set -euo pipefail
cd "$(dirname "$0")/.."
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
    platforms+=(--platform "$p")
done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${platforms[@]}" \
    -d .whl gguf==0.19.0 rapidfuzz==3.14.6 bm25s==0.3.16 PyStemmer==3.1.0 setuptools==80.9.0 wheel==0.45.1
ls .whl
