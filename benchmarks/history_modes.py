"""Chat history modes under a reasoning-dropping template vs an append-only one, in one run.

    python benchmarks/history_modes.py [--threads 1] [--variants sampled,forced] [--sampled probe]
                                       [--json out.json] [key=value ...]

One GRPO step (rollout, then one update) of the default job's shapes (the ``grpo`` preset: WebShop,
its tasks per step, group size, ``max_new_tokens``, ``max_context``, ``max_turns``, temperature,
micro-batch size, gradient checkpointing, shared prefixes; ``key=value`` overrides as on the command
line) on the built-in ``smollm2-135m`` with the ``xml`` action template (``<think>...</think>`` then
``<action>...</action>``; ``plugins.tag_count.template=xml`` to match), in three arms with the same
seed and tasks:

A. the model's own chat template (ChatML, append-only): the peer;
B. a Qwen3-style template written here (ChatML markup; the ``<think>`` block of every reply before
   the last user message is dropped, a reply after it is written with its block) with
   ``chat.history=keep``: one row per episode, increments rendered after placeholders;
C. the same template with ``chat.history=as_template``: every prompt is the template's own render,
   and a new row starts where that no longer extends the current one.

Each arm runs ``omrl train``'s own recipe (:class:`omrl.training.rl.RLRecipe`, one step, no eval,
no checkpoint) on a copy of the model directory whose ``chat_template.jinja`` is swapped (B, C).
Two variants:

- ``sampled``: the hf backend samples the replies. SmolLM2-135M hardly ever writes ``</think>``, so
  by default (``--sampled probe``) only arm A's rollout is played, to measure that share (and how
  many replies do not re-encode to their sampled ids: there ``as_template`` starts a new row even
  without reasoning). ``--sampled rollouts`` plays every arm's rollout, ``--sampled steps`` every
  arm's whole step (long: C's update trains every new row's whole prompt again).
- ``forced`` (labelled: NOT the model's own samples): an hf backend whose batched, KV-cached decode
  loop feeds scripted replies instead of sampling them (real log-probs, real prefill statistics):
  the env's scripted expert action, written by the xml template with a short reasoning in its think
  block (``<think>The next step: ...</think>`` then ``<action>...</action>``; the reasoning cut word
  by word, to nothing if need be, to fit ``max_new_tokens``). Every reply holds ``</think>``.

The expert plays both samples of a task alike (equal rewards), and a base model's samples often tie
too; so every arm sets ``algorithm.entropy_coef=1e-12``, which keeps the update from being skipped
when every advantage is 0 (the same forward and backward work; a negligible loss term).

Per arm: episodes, rows per episode, prefix breaks, the share of replies holding ``</think>``,
trained tokens (loss_mask sum), tokens in the update batch (every row, packed), tokens the update's
forward runs (a shared prompt prefix once, as ``optim.share_prefix`` runs it, packed rows included
under sdpa or eager attention), the hf backend's prefill tokens computed and reused, rollout seconds, update seconds (step
minus rollout) and step seconds; then B/A and C/A. No pass/fail limit: ``keep`` should cost what A
costs (the same ids: ``same_ids_as_a``), ``as_template`` prefills and trains each new row again.

Prints a table per variant and writes JSON (``benchmarks/results/history_modes.json`` unless ``--json``).

Measured here with the defaults (2 CPU cores shared with other jobs, one thread, 14 minutes in all,
2026-11-27): SmolLM2 wrote ``</think>`` in 0 of 32 sampled replies, and 38% of them do not re-encode
to their sampled ids. Forced: B/A 1.00 on every token count (the same ids), 0.95 step seconds (noise);
C/A 4.5 rows per episode, trained tokens 1.00, update batch tokens 2.98, update forward tokens 3.24
(shared prefixes on), prefill computed 1.07, update seconds 5.0, step seconds 3.7.
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch
from _results import default_json, machine, save_json
from rich.console import Console

from omrl.backends.base import Chats, Generation, Prompts, SamplingParams
from omrl.backends.hf import HFBackend
from omrl.chat import encode_text
from omrl.config import load_config
from omrl.config.options import TrainRunConfig
from omrl.models import resolve_model_path
from omrl.rollout import PlaySpec, RolloutSession
from omrl.training.rl import RLRecipe
from omrl.training.rl_data import TaskOrder, episodes_to_batch, sort_by_length, trainable
from omrl.training.shared_prefix import PACKED_MASK_ATTENTION, shared_prefix_groups

# Qwen3's rule for earlier replies, in ChatML markup: find the last user message; a reply before it
# loses its <think>...</think>, a reply after it is written with its reasoning block (empty if none).
REASONING_DROPPING = """\
{%- set state = namespace(last_user=-1) -%}
{%- for message in messages -%}
  {%- if message['role'] == 'user' -%}{%- set state.last_user = loop.index0 -%}{%- endif -%}
{%- endfor -%}
{%- for message in messages -%}
  {%- set body = message['content'] if message['content'] is string else '' -%}
  {%- if message['role'] == 'assistant' -%}
    {%- set reasoning = '' -%}
    {%- if '</think>' in body -%}
      {%- set reasoning = body.split('</think>')[0].split('<think>')[-1].strip('\\n') -%}
      {%- set body = body.split('</think>')[-1].lstrip('\\n') -%}
    {%- endif -%}
    {%- if loop.index0 > state.last_user -%}
      {{- '<|im_start|>assistant\\n<think>\\n' ~ reasoning ~ '\\n</think>\\n\\n' ~ body ~ '<|im_end|>\\n' -}}
    {%- else -%}
      {{- '<|im_start|>assistant\\n' ~ body ~ '<|im_end|>\\n' -}}
    {%- endif -%}
  {%- else -%}
    {{- '<|im_start|>' ~ message['role'] ~ '\\n' ~ body ~ '<|im_end|>\\n' -}}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}
"""

# (name, what, chat template: None for the model's own, chat.history)
ARMS = (
    ("A", "own template (ChatML, append-only)", None, "keep"),
    ("B", "reasoning-dropping template, history=keep", REASONING_DROPPING, "keep"),
    ("C", "reasoning-dropping template, history=as_template", REASONING_DROPPING, "as_template"),
)
SAMPLED_MODES = ("probe", "rollouts", "steps")
RATIO_KEYS = (
    "rows_per_episode",
    "trained_tokens",
    "batch_tokens",
    "update_forward_tokens",
    "prefill_computed",
    "prefill_reused",
    "rollout_seconds",
    "update_seconds",
    "step_seconds",
)


def template_copy(model: str, template: str, into: Path) -> str:
    """A directory with ``model``'s files (weights linked, not copied) and ``template`` as its chat template."""
    source = Path(resolve_model_path(model))
    into.mkdir(parents=True, exist_ok=True)
    for item in source.iterdir():
        if item.name == "chat_template.jinja" or not item.is_file():
            continue
        if item.suffix == ".safetensors":
            os.symlink(item, into / item.name)
        else:
            shutil.copy2(item, into / item.name)
    (into / "chat_template.jinja").write_text(template, encoding="utf-8")
    return str(into)


class ForcedBackend(HFBackend):
    """The hf backend with its sampler replaced by a script: every prompt's reply is the scripted text,
    fed through the same batched, KV-cached decode loop, with its log-probs under the sampling
    distribution, its KV states cached and the prefill counted as the real backend counts them.

    ``script(messages) -> text`` gives a reply from the chat so far; the end-of-turn id follows it.
    """

    name = "forced"

    def __init__(self, model: Any, tokenizer: Any, script, **kwargs: Any):
        super().__init__(model, tokenizer, **kwargs)
        if self.kv_cache is None:
            raise RuntimeError(
                "the forced backend feeds its replies through the KV-reusing decode loop; keep generation.kv_reuse on"
            )
        self.script = script
        self.replies: dict[tuple[int, ...], list[int]] = {}

    def generate(self, prompts: Prompts, params: SamplingParams, messages: Chats | None = None) -> list[Generation]:
        if messages is None:
            raise RuntimeError("the forced backend reads the chats to script the replies")
        limits = params.limits(len(prompts))
        self.replies = {}
        for prompt, chat, limit in zip(prompts, messages, limits):
            self.replies[tuple(prompt)] = self._reply_ids(self.script(chat), limit)
        return super().generate(prompts, params, messages)

    def _reply_ids(self, text: str, limit: int) -> list[int]:
        """``text`` and the end-of-turn id, its think block cut word by word until it fits ``limit``.

        A reply that does not fit even with an empty think block is refused: cut, it would no longer
        hold the expert's action, and the env would leave the path the script follows."""
        ids = encode_text(self.tokenizer, text) + [self.eos_token_id]
        while len(ids) > limit and "</think>" in text:
            head, tail = text.split("</think>", 1)
            opening, _, reasoning = head.rpartition("<think>")
            if not reasoning:
                break
            text = opening + "<think>" + " ".join(reasoning.split(" ")[:-1]) + "</think>" + tail
            ids = encode_text(self.tokenizer, text) + [self.eos_token_id]
        if len(ids) > limit:
            raise RuntimeError(
                f"the scripted reply {text!r} takes {len(ids)} tokens, over the turn's limit of "
                f"{limit}; raise generation.max_new_tokens"
            )
        return ids

    def _sampler(self, params: SamplingParams, prompts: list[torch.Tensor]) -> "ScriptedSampler":
        """The hf backend's own decode loop (batched, KV-cached), with each row's next id taken from its
        scripted reply instead of sampled."""
        if params.top_p < 1.0:
            raise RuntimeError("the forced backend scores under temperature only; use generation.top_p=1")
        return ScriptedSampler(
            [self.replies[tuple(p.tolist())] for p in prompts], params.temperature if not params.greedy else 1.0
        )


class ScriptedSampler:
    """Picks each live row's next scripted id; its log-prob is the model's under the sampling temperature."""

    def __init__(self, replies: list[list[int]], temperature: float):
        self.replies, self.temperature = replies, temperature
        self.taken = [0] * len(replies)

    def __call__(self, logits: torch.Tensor, live: list[int]) -> tuple[list[int], list[float]]:
        scores = torch.log_softmax(logits / self.temperature, dim=-1)
        picked = []
        for row in live:
            picked.append(self.replies[row][self.taken[row]])
            self.taken[row] += 1
        return picked, scores.gather(1, torch.tensor(picked)[:, None]).squeeze(1).tolist()


def expert_script(cfg: TrainRunConfig, tasks: list[Any]):
    """A script for :class:`ForcedBackend`: each task's expert actions (played once here), keyed by the
    chat's first user message; turn k's reply is action k in the xml template's format with a reasoning."""
    session = RolloutSession.from_config(cfg, expert=True)
    try:
        episodes = session.play(tasks, PlaySpec(split=cfg.env.split, group_size=1, expert=True)).episodes
        template = session.env_of().template
    finally:
        session.close()
    actions = {}
    for ep in episodes:
        first_user = next(m["content"] for m in ep.messages if m["role"] == "user")
        actions[first_user] = [turn.action for turn in ep.turns]

    def script(chat: Sequence[Mapping[str, str]]) -> str:
        first_user = next(m["content"] for m in chat if m["role"] == "user")
        turn = sum(m["role"] == "assistant" for m in chat)
        action = actions[first_user][turn]
        kind = (
            "search for the item"
            if action.startswith("search[")
            else "buy it"
            if action == "click[buy now]"
            else f"choose {action[6:-1]}"
        )
        reasoning = (
            f"The next step: {kind}, since the page shows what the instruction asks for and "
            "nothing on it rules that out."
        )
        return template.format_action(action, None, reasoning)

    return script, [len(ep.turns) for ep in episodes]


class RolloutDone(Exception):
    """Raised out of a rollout-only step once its episodes are played."""


class StepDone(Exception):
    """Raised out of the step's end (its logging done), before the run saves its final model."""


class OneStep(RLRecipe):
    """``omrl train``'s recipe for one step, its rollout timed and kept, no checkpoint or final model;
    with ``rollout_only`` the step stops after its rollout (:class:`RolloutDone`)."""

    def __init__(self, cfg: TrainRunConfig, script=None, rollout_only: bool = False):
        super().__init__(cfg, on_step_end=self._logged, console=Console(stderr=True, quiet=True))
        self.script = script
        self.rollout_only = rollout_only
        self.episodes: list[Any] = []
        self.rollout_seconds = float("nan")
        self.stats: dict[str, float] = {}
        self.logged: dict[str, float] = {}

    def setup(self) -> None:
        super().setup()
        if self.script is not None:
            gen = self.cfg.generation
            self.run.session.backend.close()
            self.run.session.backend = ForcedBackend(
                self.rollout_model,
                self.tokenizer,
                self.script,
                batch_size=gen.batch_size,
                kv_reuse=gen.kv_reuse,
                kv_cache_mb=gen.kv_cache_mb,
            )
        session = self.run.session
        play = session.play

        def kept(*args: Any, **kwargs: Any) -> list[Any]:
            started = time.perf_counter()
            self.episodes = play(*args, **kwargs)
            self.rollout_seconds = time.perf_counter() - started
            if self.rollout_only:
                self.stats = session.backend.take_stats()
                raise RolloutDone
            return self.episodes

        session.play = kept

    def _logged(self, step: int, metrics: dict[str, float]) -> None:
        self.logged = dict(metrics)
        raise StepDone


def forward_tokens(batch, shares_prefix: bool, packed_rows_share: bool) -> int:
    """Tokens the update's forward runs: every row whole, or a shared prompt prefix once per group (packed
    rows among them where the model's attention takes their mask, as the recipe decides)."""
    lengths = batch["attention_mask"].sum(-1).tolist()
    if not shares_prefix:
        return int(sum(lengths))
    total = 0
    for rows, prefix in shared_prefix_groups(batch, packed_rows_share):
        total += sum(lengths[i] for i in rows) - (len(rows) - 1) * prefix if prefix else sum(lengths[i] for i in rows)
    return int(total)


def reencodes(tokenizer, ep) -> list[bool]:
    """Per turn, whether the reply's text encodes back to the ids sampled (the end-of-turn id aside): where it
    does not, a template render of the chat cannot extend the row, reasoning or none."""
    out = []
    for turn in ep.turns:
        ids = ep.token_ids[turn.span[0] : turn.span[1]]
        if ids and ids[-1] == tokenizer.eos_token_id:
            ids = ids[:-1]
        out.append(encode_text(tokenizer, turn.response) == ids)
    return out


def run_arm(base: list[str], model_name: str, history: str, script, rollout_only: bool) -> dict[str, Any]:
    """One step (or only its rollout) of one arm: its measurements."""
    overrides = [*base, f"model.name={model_name}", f"chat.history={history}"]
    cfg = load_config(TrainRunConfig, "grpo", overrides)
    recipe = OneStep(cfg, script, rollout_only)
    try:
        recipe.setup()
        recipe.train()
    except (RolloutDone, StepDone):
        pass
    finally:
        recipe.cleanup()
    shares, tokenizer = recipe._shares_prefix(), recipe.tokenizer
    packed_share = getattr(recipe.model.config, "_attn_implementation", None) in PACKED_MASK_ATTENTION
    episodes, logged = recipe.episodes, recipe.logged
    stats = (
        recipe.stats
        if rollout_only
        else {
            "prefill_computed": logged.get("prefill_tokens"),
            "prefill_reused": logged.get("prefill_reused"),
            "decode_tokens": logged.get("generated_tokens"),
        }
    )
    batch = sort_by_length(
        episodes_to_batch(trainable(episodes), tokenizer.pad_token_id, cfg.reward.allocation, cfg.reward.gamma)
    )
    replies = [turn.response for ep in episodes for turn in ep.turns]
    exact = [same for ep in episodes for same in reencodes(tokenizer, ep)]
    groups: dict[int, set[float]] = {}
    for ep in episodes:
        groups.setdefault(ep.group, set()).add(round(ep.total_reward, 9))
    # the step's own clock: its rollout_time (play, tasks, eval mode) and step_time; update = step - rollout
    rollout_s = recipe.rollout_seconds if rollout_only else logged.get("rollout_time")
    step_s = None if rollout_only else logged.get("step_time")
    del recipe
    gc.collect()
    return {
        "episodes": len(episodes),
        "turns": sum(len(ep.turns) for ep in episodes),
        "rows_per_episode": sum(1 + len(ep.row_starts) for ep in episodes) / max(1, len(episodes)),
        "prefix_breaks": sum(len(ep.row_starts) for ep in episodes),
        "think_share": sum("</think>" in text for text in replies) / max(1, len(replies)),
        "reencode_mismatch_share": exact.count(False) / max(1, len(exact)),
        "trained_tokens": int(batch["loss_mask"].sum()),
        "batch_tokens": int(batch["attention_mask"].sum()),
        "update_forward_tokens": forward_tokens(batch, shares, packed_share),
        "shared_prefixes": shares,
        "prefill_computed": stats.get("prefill_computed"),
        "prefill_reused": stats.get("prefill_reused"),
        "generated_tokens": stats.get("decode_tokens"),
        "rollout_seconds": rollout_s,
        "step_seconds": step_s,
        "update_seconds": None if step_s is None or rollout_s is None else step_s - rollout_s,
        "update_ran": None if rollout_only else "loss" in logged,
        "all_advantages_zero": all(len(r) == 1 for r in groups.values()),
        "success": sum(ep.won for ep in episodes) / max(1, len(episodes)),
        "reward": sum(ep.total_reward for ep in episodes) / max(1, len(episodes)),
        "loss": logged.get("loss"),
        "ids": [list(ep.token_ids) for ep in episodes],
    }


def ratios(arms: dict[str, dict[str, Any]]) -> dict[str, dict[str, float]]:
    """B/A and C/A for each of RATIO_KEYS (arms that failed are left out)."""
    out: dict[str, dict[str, float]] = {}
    peer = arms.get("A")
    for name in ("B", "C"):
        arm = arms.get(name)
        if peer is None or arm is None:
            continue
        out[f"{name}/A"] = {
            key: arm[key] / peer[key] for key in RATIO_KEYS if isinstance(arm.get(key), (int, float)) and peer.get(key)
        }
    return out


def print_table(variant: str, arms: dict[str, dict[str, Any]], errors: dict[str, str], ratio: dict) -> None:
    columns = (
        ("episodes", "eps", "{:>4d}"),
        ("rows_per_episode", "rows/ep", "{:>7.2f}"),
        ("prefix_breaks", "breaks", "{:>6.0f}"),
        ("think_share", "</think>", "{:>8.0%}"),
        ("trained_tokens", "trained", "{:>7d}"),
        ("batch_tokens", "batch", "{:>6d}"),
        ("update_forward_tokens", "upd fwd", "{:>7d}"),
        ("prefill_computed", "prefill", "{:>7.0f}"),
        ("prefill_reused", "reused", "{:>6.0f}"),
        ("rollout_seconds", "roll s", "{:>6.1f}"),
        ("update_seconds", "upd s", "{:>6.1f}"),
        ("step_seconds", "step s", "{:>6.1f}"),
    )
    widths = [len(title) for _, title, _ in columns]
    print(f"  {variant}:")
    print(f"  {'':50s} " + " ".join(f"{title:>{w}s}" for (_, title, _), w in zip(columns, widths)))
    for name, what, _, _ in ARMS:
        label = f"{name} {what}"
        if name not in arms and name not in errors:
            continue
        if name in errors:
            print(f"  {label:50s} FAILED: {errors[name].strip().splitlines()[-1]}")
        elif name in arms:
            cells = [
                f"{'-' if arms[name][key] is None else fmt.format(arms[name][key]):>{w}s}"
                for (key, _, fmt), w in zip(columns, widths)
            ]
            print(f"  {label:50s} " + " ".join(cells))
    for pair, values in ratio.items():
        shown = ", ".join(f"{key} {value:.2f}" for key, value in values.items())
        print(f"  {pair}: {shown}")
    same = {name: arm["same_ids_as_a"] for name, arm in arms.items() if "same_ids_as_a" in arm}
    mismatch = {name: f"{arm['reencode_mismatch_share']:.0%}" for name, arm in arms.items()}
    print(f"  same token ids as A: {same}; replies whose text does not re-encode to their ids: {mismatch}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: steadier on a shared machine)")
    parser.add_argument("--variants", default="sampled,forced", help="comma-separated: sampled, forced")
    parser.add_argument(
        "--sampled",
        choices=SAMPLED_MODES,
        default="probe",
        help="what the sampled variant plays: probe (arm A's rollout: how often the model writes "
        "</think>), rollouts (every arm's rollout) or steps (every arm's rollout and update)",
    )
    parser.add_argument("--json", type=Path, default=default_json("history_modes"), help="where the results go")
    parser.add_argument("overrides", nargs="*", help="key=value, as for omrl train")
    args = parser.parse_args()
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    if not variants or set(variants) - {"forced", "sampled"}:
        parser.error(f"--variants takes forced and/or sampled, got {args.variants!r}")

    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="omrl-history-modes-"))
    base = [
        "model.name=smollm2-135m",
        "env.template=xml",
        "plugins.tag_count.template=xml",
        "steps=1",
        "eval_tasks=0",
        "algorithm.entropy_coef=1e-12",
        "logging.save_rollouts=false",
        "logging.tensorboard=false",
        *args.overrides,
    ]
    cfg = load_config(TrainRunConfig, "grpo", base)
    session = RolloutSession.from_config(cfg, expert=True)
    try:
        tasks = TaskOrder(list(session.env_of().pool.probe().split_of(cfg.env.split)), cfg.seed).take(
            cfg.tasks_per_step
        )
    finally:
        session.close()
    thinking_model = template_copy(cfg.model.name, REASONING_DROPPING, work / "model")
    gen = cfg.generation
    record: dict[str, Any] = {
        "model": cfg.model.name,
        "env": cfg.env.name,
        "preset": "grpo",
        "action_template": cfg.env.template,
        "threads": args.threads,
        "tasks": tasks,
        "group_size": cfg.group_size,
        "max_new_tokens": gen.max_new_tokens,
        "max_context": gen.max_context,
        "max_turns": cfg.env.max_turns,
        "temperature": gen.temperature,
        "micro_batch_size": cfg.optim.micro_batch_size,
        "gradient_checkpointing": cfg.model.gradient_checkpointing,
        "entropy_coef": cfg.algorithm.entropy_coef,
        "overrides": args.overrides,
        "sampled": args.sampled,
        "arms": {name: what for name, what, _, _ in ARMS},
        "variants": {},
    }
    print(
        f"{cfg.model.name} on {cfg.env.name} (grpo preset shapes, xml action template): tasks {tasks} x "
        f"{cfg.group_size} samples, max_new_tokens {gen.max_new_tokens}, max_context {gen.max_context}, "
        f"{args.threads} threads",
        flush=True,
    )
    try:
        for variant in variants:
            script = None
            if variant == "forced":
                script, expert_turns = expert_script(cfg, tasks)
                record["expert_turns"] = expert_turns
            arms: dict[str, dict[str, Any]] = {}
            errors: dict[str, str] = {}
            rollout_only = variant == "sampled" and args.sampled != "steps"
            for name, _what, template, history in ARMS:
                if variant == "sampled" and args.sampled == "probe" and name != "A":
                    continue
                model_name = cfg.model.name if template is None else thinking_model
                arm_started = time.perf_counter()
                try:
                    arms[name] = run_arm(
                        [*base, f"logging.output_dir={work / variant / name}"],
                        model_name,
                        history,
                        script,
                        rollout_only,
                    )
                except Exception:  # noqa: BLE001 - an arm's failure is a result: record it, run the others
                    errors[name] = traceback.format_exc()
                    print(f"  {variant} {name} failed:\n{errors[name]}", flush=True)
                print(f"  {variant} {name} done in {time.perf_counter() - arm_started:.0f} s", flush=True)
            ids = {name: arm.pop("ids") for name, arm in arms.items()}
            for name in ("B", "C"):
                if name in arms and "A" in ids:
                    arms[name]["same_ids_as_a"] = ids[name] == ids["A"]
            ratio = ratios(arms)
            what = (
                "scripted expert replies with a think block; real log-probs and prefill"
                if variant == "forced"
                else f"the model's own samples, {args.sampled}"
            )
            record["variants"][variant] = {
                "what": what,
                "rollout_only": rollout_only,
                "arms": arms,
                "ratios": ratio,
                "errors": errors,
            }
            print_table(f"{variant} ({what})", arms, errors, ratio)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    record["seconds"] = time.perf_counter() - started
    record["machine"] = machine(args.threads)
    save_json(args.json, record)
    print(f"  {record['seconds'] / 60:.1f} minutes in all; wrote {args.json}")


if __name__ == "__main__":
    main()
