#!/usr/bin/env bash
# Fetch, into .whl/ (git-ignored), the wheels scripts/gpu_check.sh installs on a lent GPU machine: the
# packages omrl and its model tests need that its image (Python 3.12, torch, transformers, accelerate,
# pytest) lacks, and setuptools to install omrl itself. That machine reaches no package registry; the
# wheels travel with the working tree (`carry: [".whl"]`).
set -euo pipefail
cd "$(dirname "$0")/.."
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
    platforms+=(--platform "$p")
done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${platforms[@]}" \
    -d .whl gguf==0.19.0 rapidfuzz==3.14.6 bm25s==0.3.16 PyStemmer==3.1.0 setuptools==80.9.0 wheel==0.45.1 \
    uvicorn==0.55.0 fastapi==0.165.0 starlette==1.10.0 opentelemetry-api==1.45.2 \
    openai==3.57.0 httpx2==2.16.2 httpcore2==2.16.2 truststore==0.10.5 jiter==0.19.0 sniffio==1.3.1 \
    pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
# (the tests' fake OpenAI server needs uvicorn and fastapi, the agent-program tests openai; reasoning-gym is
# left out: its pycosat has no wheel for Python 3.12, so the check deselects the tests of its env)
ls .whl
# SmolLM2-135M's config and tokenizer, without its weights (over what can travel), in .whl/smollm2-135m-shape:
# the check's random-init model of that shape replays the replies the real one sampled here
# (benchmarks/continuous_batching.py --replies). Needs omrl installed here (its venv active).
python3 - <<'PY'
import shutil
from pathlib import Path

from omrl.models import resolve_model_path

source, target = Path(resolve_model_path("smollm2-135m")), Path(".whl/smollm2-135m-shape")
target.mkdir(parents=True, exist_ok=True)
for name in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
    shutil.copy(source / name, target / name)
print(f"{target}: {', '.join(sorted(p.name for p in target.iterdir()))}")
PY
