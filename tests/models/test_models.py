"""The model loader: built-in names offline, local dirs, clear errors."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from omrl.errors import OmrlError
from omrl.models import BUILTIN_MODELS, WEBSHOP_DELTA, load_model, load_tokenizer, resolve_model_path
from omrl.models.delta import file_digest
from omrl.rollout import PlaySpec


def test_tiny_is_about_a_million_parameters_with_a_chat_template(tiny_model):
    model, tok = tiny_model
    n = sum(p.numel() for p in model.parameters())
    assert 0.5e6 < n < 2e6
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert tok.eos_token == "<|im_end|>" and tok.pad_token is not None


def test_tiny_is_built_deterministically(tmp_path, monkeypatch, tiny_model_dir):
    monkeypatch.setenv("OMRL_HOME", str(tmp_path))
    fresh = resolve_model_path("tiny")
    assert fresh.startswith(str(tmp_path))
    a, _ = load_model(fresh)
    b, _ = load_model(tiny_model_dir)
    for (name, pa), (_, pb) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(pa, pb), name
    assert not [p for p in tmp_path.joinpath("models").iterdir() if p.name.startswith(".")], "temp dir left"


def test_default_model_is_the_real_smollm2(smollm2_dir):
    model, tok = load_model(smollm2_dir)
    assert 130e6 < sum(p.numel() for p in model.parameters()) < 140e6
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    out = model.generate(**prompt, max_new_tokens=8, do_sample=False)
    assert "Paris" in tok.decode(out[0, prompt["input_ids"].shape[1] :])


def test_local_directory_loads(tiny_model_dir):
    model, tok = load_model(tiny_model_dir)
    assert model.config.model_type == "qwen2"


def test_missing_paths_and_bad_names_are_clear(tmp_path):
    with pytest.raises(OmrlError, match="not found.*built-in name"):
        resolve_model_path(str(tmp_path / "nope"))
    with pytest.raises(OmrlError, match="not found"):
        resolve_model_path("no-such-model")
    with pytest.raises(OmrlError, match="has no config.json"):
        resolve_model_path(str(tmp_path))
    with pytest.raises(OmrlError, match="unknown dtype 'float8'"):
        load_model("tiny", dtype="float8")
    assert set(BUILTIN_MODELS) == {"smollm2-135m", "smollm2-135m-webshop", "tiny"}


def test_a_run_folder_that_is_not_there_is_no_hub_id(tmp_path, monkeypatch):
    """``--model runs/tiny-sft`` mistyped, with runs/ here: the folder is named, not the hub's connection."""
    (tmp_path / "runs" / "tiny-sft").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(OmrlError, match=r"model 'runs/tiny-stf' not found: runs/ is a folder here .*tiny-sft"):
        resolve_model_path("runs/tiny-stf")
    assert resolve_model_path("HuggingFaceTB/SmolLM2-135M") == "HuggingFaceTB/SmolLM2-135M"  # no such folder here


def test_a_local_model_without_tokenizer_files_is_refused_naming_them(tiny_model_dir, tmp_path):
    for name in ("config.json", "generation_config.json", "model.safetensors"):  # the weights, no tokenizer
        shutil.copy(Path(tiny_model_dir) / name, tmp_path / name)
    expected = (
        f"model directory {tmp_path} has no tokenizer: none of tokenizer.json, tokenizer_config.json, "
        "vocab.json, vocab.txt, merges.txt, tokenizer.model, spiece.model; copy the tokenizer files of the "
        "model it was trained from into it"
    )
    for load in (load_tokenizer, load_model):
        with pytest.raises(OmrlError) as info:
            load(str(tmp_path))
        assert str(info.value) == expected
    shutil.copy(Path(tiny_model_dir) / "tokenizer.json", tmp_path / "tokenizer.json")  # one file is enough
    assert len(load_tokenizer(str(tmp_path))) == len(load_tokenizer(tiny_model_dir))


def test_trust_remote_code_is_off_by_default(monkeypatch, tiny_model_dir):
    seen = {}
    import transformers

    real = transformers.AutoModelForCausalLM.from_pretrained

    def spy(path, **kw):
        seen.update(kw)
        return real(path, **kw)

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", spy)
    load_model(tiny_model_dir)
    assert seen["trust_remote_code"] is False


@pytest.mark.slow
def test_the_webshop_model_is_built_from_the_shipped_delta_and_buys(smollm2_dir):
    """smollm2-135m-webshop (base + the shipped delta) plays WebShop's first test goals greedy, on the
    prompts it was tuned on. The base model never buys (0 score); the full SFT model scored 0.83."""
    from omrl.config import load_config
    from omrl.config.options import EvalRunConfig
    from omrl.rollout import RolloutSession

    cfg = load_config(
        EvalRunConfig,
        None,
        [  # the prompts and limits of the WebShop presets
            "model.name=smollm2-135m-webshop",
            "env.name=webshop",
            "env.max_turns=8",
            "env.demonstration=false",
            "generation.temperature=0",
            "generation.max_new_tokens=48",
            "generation.max_context=2048",
        ],
    )
    with RolloutSession.from_config(cfg) as session:
        episodes = session.play(session.task_ids("test", 5), PlaySpec(split="test")).episodes
    scores = [ep.score for ep in episodes]
    assert all(turn.format_ok for ep in episodes for turn in ep.turns), [ep.messages[-1] for ep in episodes]
    # measured: [0.6, 1, 1, 0, 1]; the full SFT model [0.6, 1, 1, 0, 1] too; goal 4 won at ranks 8-32.
    # A margin for other CPUs, where a greedy choice may flip: the base model scores 0 on all five.
    assert sum(score > 0 for score in scores) >= 3 and sum(scores) / len(scores) > 0.4, scores
    assert any(ep.won for ep in episodes), scores
    built = resolve_model_path("smollm2-135m-webshop")
    assert open(f"{built}/omrl_delta.sha256").read().strip() == file_digest(WEBSHOP_DELTA)


def test_a_path_that_holds_no_model_is_named_for_what_it_is(tiny_model_dir, tmp_path):
    import shutil

    step = tmp_path / "run" / "checkpoints" / "step-00000002"
    shutil.copytree(tiny_model_dir, step / "model")
    with pytest.raises(OmrlError, match=f"{step} is a run's checkpoint; its model is {step / 'model'}: give that"):
        resolve_model_path(str(step))
    with pytest.raises(OmrlError, match="is a run that stopped before its first checkpoint: it holds no model"):
        resolve_model_path(str(tmp_path / "run"))  # an unfinished checkpoint: --resume would find nothing
    (step / "COMPLETE").write_text("step 2\n")
    with pytest.raises(OmrlError, match="is a run that stopped before it saved its model: resume it"):
        resolve_model_path(str(tmp_path / "run"))
    (tmp_path / "qa.jsonl").write_text("{}\n")
    with pytest.raises(OmrlError, match="qa.jsonl is a file; give a model's folder"):
        resolve_model_path(str(tmp_path / "qa.jsonl"))
    assert resolve_model_path(str(step / "model")) == str(step / "model")


def test_a_lora_checkpoint_s_adapter_folder_is_named_as_one(tiny_model_dir, tmp_path):
    """--model RUN/checkpoints/step-N/model of a LoRA run said only "has no config.json"."""
    from peft import LoraConfig, get_peft_model

    model, _ = load_model(tiny_model_dir)
    get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj"])).save_pretrained(tmp_path / "model")
    with pytest.raises(
        OmrlError,
        match=f"is a LoRA adapter \\(a checkpoint's\\), not a model: merge it into one with omrl checkpoint merge {tmp_path}",
    ):
        resolve_model_path(str(tmp_path / "model"))
    # the checkpoint's own folder, one up: it said "has no config.json; expected a Hugging Face model directory"
    with pytest.raises(OmrlError, match="is a checkpoint of a LoRA run: its model/ holds the adapter alone"):
        resolve_model_path(str(tmp_path))
