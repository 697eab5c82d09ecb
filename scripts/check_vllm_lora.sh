#!/usr/bin/env bash
# LoRA adapters into a running `vllm serve` (generation.weight_sync=lora), for real.
#
#   scripts/check_vllm_lora.sh [VENV_DIR]   (the venv scripts/check_vllm_cpu.sh made; it calls this last)
#
# Starts `vllm serve` on the tiny model with LoRA enabled, runtime adapter loading allowed and vLLM's
# RL routes (for a full push to compare with), then scripts/check_vllm_server.py --weight-sync lora:
# three GRPO steps of a LoRA model whose every episode the server samples from the adapter pushed
# after each update, an adapter of known weights checked against its peft model, and the adapter push
# timed against a full push. With BENCH=1 it then runs benchmarks/lora_sync.py (tiny and SmolLM2-135M).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/wait_for_server.sh
. "$ROOT/scripts/wait_for_server.sh"
VENV="${1:-${TMPDIR:-/tmp}/omrl-vllm-cpu}"
# shellcheck disable=SC1091
. "$VENV/bin/activate"
export VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-2}"
export HF_HUB_OFFLINE=1
export OMRL_PLUGINS=omrl

PORT="${LORA_PORT:-8012}"
MODEL_DIR="$(python -c 'from omrl.models import resolve_model_path; print(resolve_model_path("tiny"))')"
VLLM_ALLOW_RUNTIME_LORA_UPDATING=True VLLM_SERVER_DEV_MODE=1 python -m vllm.entrypoints.openai.api_server \
    --model "$MODEL_DIR" --served-model-name tiny --port "$PORT" --dtype float32 --max-model-len 512 \
    --enforce-eager --enable-lora --max-lora-rank 8 --max-loras 2 > "$VENV/vllm-serve-lora.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true' EXIT
wait_for_server $SERVER "$PORT" "$VENV/vllm-serve-lora.log" 180
python "$ROOT/scripts/check_vllm_server.py" --base-url "http://127.0.0.1:$PORT/v1" --weight-sync lora
kill $SERVER 2>/dev/null || true
wait $SERVER 2>/dev/null || true
if [ "${BENCH:-0}" = 1 ]; then
    python "$ROOT/benchmarks/lora_sync.py"
fi
