"""The 2025-26 additions to `omrl train`, run for real on the tiny model: the adaptive KL coefficient,
DAPO's dynamic sampling, ReMax's greedy baseline, on-policy distillation from a teacher, and the
constant loss normaliser; each resumes exactly where it has state."""

from __future__ import annotations

import io
import json
import re
import warnings
from pathlib import Path

import pytest
import torch
from rich.console import Console

from omrl.config.options import TrainRunConfig
from omrl.data.trajectory import Episode, read_episodes
from omrl.errors import ConfigError, UnknownNameError
from omrl.hookspecs import hookimpl
from omrl.models.loading import load_model
from omrl.training import online
from omrl.training.metrics import read_metrics
from omrl.training.online import episode_token_budget
from omrl.training.online_run import OnlineRun
from omrl.training.rl import run_rl
from tests.training.helpers import EnvPlugin, stop_then_resume

QUIET = Console(file=io.StringIO())


class HalfConstantReward:
    """``half_constant``: 1 for every sample of an even task (a group with nothing to compare), the
    sample's index for an odd one."""

    @hookimpl
    def register_rewards(self, register):
        def half_constant(episodes):
            """1 on even tasks, the sample index on odd ones, on the last turn."""
            value = [1.0 if ep.task_id % 2 == 0 else float(ep.sample) for ep in episodes]
            return [[0.0] * (len(ep.turns) - 1) + [v] for ep, v in zip(episodes, value)]

        register("half_constant", half_constant)


@pytest.fixture
def config(sample_index_configs, register_plugin):
    register_plugin(HalfConstantReward(), name="half-constant")
    return sample_index_configs()


def numbers(out) -> list[dict]:
    """The run's logged numbers, less times, speeds and memory."""
    return [
        {k: v for k, v in r.items() if not (k.endswith("_per_s") or "time" in k or k.startswith("peak_"))}
        for r in read_metrics(out)
    ]


def rollout(cfg: TrainRunConfig, step: int) -> list:
    return read_episodes(Path(cfg.logging.output_dir) / "rollouts" / f"step-{step:08d}.parquet")


def test_a_wrong_algorithm_setting_is_refused_before_any_model_loads(config, monkeypatch):
    def load_models(*args, **kwargs):
        raise AssertionError("a model was loaded before the algorithm settings were checked")

    monkeypatch.setattr(online, "load_models", load_models)
    with pytest.raises(UnknownNameError, match="unknown advantage estimator 'grpoo'. Did you mean 'grpo'"):
        run_rl(config("algorithm.advantage=grpoo"), console=QUIET)
    with pytest.raises(UnknownNameError, match="unknown policy loss 'gspoo'"):
        run_rl(config("algorithm.policy_loss=gspoo"), console=QUIET)
    with pytest.raises(ConfigError, match="pass_k must be an integer with 1 <= pass_k <= the group size"):
        run_rl(config("algorithm.advantage=pass_at_k", "algorithm.pass_k=5"), console=QUIET)


# pass_at_k: of the samples scoring 0, 1, 2 one passes, so pass@2 of the group is neither 0 nor 1
ESTIMATOR_SETTINGS = {"gae": ("algorithm.name=ppo",), "pass_at_k": ("algorithm.pass_k=2", "algorithm.pass_threshold=2")}


@pytest.mark.slow  # a training run per built-in (27); tests/algos checks each formula fast
@pytest.mark.parametrize("kind", ["advantage", "policy_loss", "kl"])
def test_every_built_in_algorithm_trains_a_step_through_the_recipe(config, kind):
    """Each registered estimator, policy loss and KL estimator runs one real update of the tiny model:
    finite loss and gradient, weights changed (the hand-computed tests check each formula)."""
    from omrl import registry

    builtin = [c.name for c in registry.algorithms.components(kind) if c.plugin.startswith("omrl")]
    assert len(builtin) >= {"advantage": 11, "policy_loss": 10, "kl": 6}[kind]
    for name in builtin:
        settings = {
            "advantage": (f"algorithm.advantage={name}", *ESTIMATOR_SETTINGS.get(name, ())),
            "policy_loss": (f"algorithm.policy_loss={name}",),
            "kl": (f"algorithm.kl_estimator={name}", "algorithm.kl_coef=0.1"),
        }[kind]
        cfg = config(*settings, "steps=1", out=f"{kind}-{name}")
        summary = run_rl(cfg, console=QUIET)
        record = read_metrics(cfg.logging.output_dir)[0]
        assert summary["skipped_updates"] == 0, name
        assert all(record[key] == record[key] for key in ("loss", "grad_norm")), name  # not NaN
        if kind == "kl":
            assert record["kl"] >= 0 or name in ("k1", "k1+"), name


# -- adaptive KL ---------------------------------------------------------------------------------------


@pytest.mark.slow  # a full run, then one stopped and resumed: two runs compared
def test_the_kl_coefficient_follows_ziegler_s_rule_and_resumes(config):
    settings = ("algorithm.kl_coef=0.05", "algorithm.kl_target=0.001", "algorithm.kl_horizon=10", "steps=3")
    full = config(*settings, "logging.save_steps=1", out="full")
    run_rl(full, console=QUIET)
    records = read_metrics(full.logging.output_dir)
    coef = 0.05
    for record in records:  # the coefficient a step used, then moved by the KL that step measured
        assert record["kl_coef"] == pytest.approx(coef, rel=1e-9)
        error = min(max(record["kl_token_mean"] / 0.001 - 1.0, -0.2), 0.2)
        coef *= 1.0 + error * 6 / 10  # 2 tasks x 3 samples
    # step 1 updates the very policy the reference copies: KL 0, below target, so the coefficient falls
    assert records[0]["kl_token_mean"] == 0.0 and records[1]["kl_coef"] < 0.05
    stopped = config(*settings, "logging.save_steps=1", out="stopped")
    stop_then_resume(stopped, console=QUIET)
    assert numbers(stopped.logging.output_dir) == numbers(full.logging.output_dir)


def test_a_kl_that_is_not_finite_leaves_the_coefficient_and_a_checkpoint_must_hold_a_number():
    from omrl.algos import AlgoConfig
    from omrl.training.kl_control import AdaptiveKL

    control = AdaptiveKL(AlgoConfig(kl_coef=0.05, kl_target=0.01, kl_horizon=10))
    control.update(float("nan"), 6)
    assert control.coef == 0.05
    control.update(0.02, 5)  # twice the target: the error is clipped to +0.2
    assert control.coef == pytest.approx(0.05 * (1 + 0.2 * 5 / 10))
    with pytest.raises(ConfigError, match="adaptive kl_coef is nan"):
        control.load_state_dict({"kl_coef": float("nan")})


def test_an_adaptive_kl_needs_a_coefficient_to_adapt(config):
    with pytest.raises(ConfigError, match="kl_target=0.01 adapts kl_coef, which must then start above 0"):
        run_rl(config("algorithm.kl_target=0.01"), console=QUIET)


# -- dynamic sampling ----------------------------------------------------------------------------------


@pytest.mark.slow
def test_dynamic_sampling_trains_only_groups_that_differ_and_keeps_the_batch_full(config):
    cfg = config(
        "reward.weights={half_constant: 1.0}", "algorithm.dynamic_sampling=true", "tasks_per_step=4", "steps=2"
    )
    run_rl(cfg, console=QUIET)
    records = read_metrics(cfg.logging.output_dir)
    for step, record in enumerate(records, start=1):
        episodes = rollout(cfg, step)
        groups = {ep.group for ep in episodes}
        assert len(groups) == 4 and len(episodes) == 12, step  # tasks_per_step groups of group_size
        assert all(ep.task_id % 2 == 1 for ep in episodes)  # only the tasks whose samples differ
        for group in groups:  # a group is one task, never two
            assert len({ep.task_id for ep in episodes if ep.group == group}) == 1
        # half the tasks drawn are constant: 4 varied groups take 8 tasks, 2 draws of 4
        assert record["sampling_draws"] >= 1 and record["groups_dropped"] >= 2 and record["groups_short"] == 0
        assert not record.get("skipped_updates")


@pytest.mark.slow  # a full run, then one stopped and resumed: two runs compared
def test_dynamic_sampling_resumes_to_the_same_draws(config):
    settings = ("reward.weights={half_constant: 1.0}", "algorithm.dynamic_sampling=true", "steps=3")
    full = config(*settings, "logging.save_steps=1", out="full")
    run_rl(full, console=QUIET)
    stopped = config(*settings, "logging.save_steps=1", out="stopped")
    stop_then_resume(stopped, console=QUIET)
    assert numbers(stopped.logging.output_dir) == numbers(full.logging.output_dir)
    assert [ep.task_id for ep in rollout(stopped, 3)] == [ep.task_id for ep in rollout(full, 3)]


def test_dynamic_sampling_stops_drawing_at_its_bound_and_says_so(config):
    cfg = config(
        "reward.weights={goal: 1.0}",  # the untrained model never reaches the goal: every group is constant
        "algorithm.dynamic_sampling=true",
        "algorithm.dynamic_sampling_max_draws=2",
        "steps=1",
    )
    summary = run_rl(cfg, console=QUIET)
    record = read_metrics(cfg.logging.output_dir)[0]
    assert record["sampling_draws"] == 2 and record["groups_dropped"] == 6 and record["groups_short"] == 2
    assert summary["skipped_updates"] == 1  # nothing left to train on


def test_dynamic_sampling_keeps_a_group_for_every_seat_the_policy_plays(config, tmp_path):
    """Self-play makes a group per task and seat: the step kept only tasks_per_step of them, and counted
    none of the varied groups it threw away as dropped."""
    questions = tmp_path / "qa.jsonl"
    questions.write_text(
        "".join(json.dumps({"question": f"What is {n} + 1?", "answer": n + 1}) + "\n" for n in range(4))
    )
    seats = ("env.name=solve-verify", f"plugins.solve-verify.path={questions}", "group_size=2")
    cfg = config(*seats, "reward.weights={sample_index: 1.0}", "algorithm.dynamic_sampling=true", "steps=1")
    run_rl(cfg, console=QUIET)
    record = read_metrics(cfg.logging.output_dir)[0]
    episodes = rollout(cfg, 1)
    played = {(ep.task_id, ep.info["seat"]) for ep in episodes}
    tasks = {task for task, _ in played}
    assert len(tasks) == 2 and played == {(task, seat) for task in tasks for seat in ("solver", "verifier")}
    assert len({ep.group for ep in episodes}) == 4 and len(episodes) == 8
    assert record["sampling_draws"] == 0 and record["groups_dropped"] == 0 and record["groups_short"] == 0


def test_dynamic_sampling_counts_the_varied_groups_it_draws_beyond_the_step_as_dropped():
    from omrl.data.trajectory import Turn
    from omrl.training import dynamic_sampling

    def group(number: int, rewards: tuple[float, float]) -> list[Episode]:
        """Two samples of task ``number``, one model turn each, their total rewards ``rewards``."""
        turn = Turn(observation="o", response="r", action="r", format_ok=True, reward=0.0, done=True)
        return [
            Episode("env", number, "train", "", turns=[turn], loss_mask=[1], rewards={"total": [reward]}, group=number)
            for reward in rewards
        ]

    draws = [group(0, (0.0, 1.0)) + group(1, (1.0, 1.0)), group(0, (0.0, 1.0)) + group(1, (1.0, 0.0))]
    kept, played, metrics = dynamic_sampling.fill(lambda n: draws[n], 2, 4, lambda missing: missing > 0)
    assert len(played) == 8 and [ep.group for ep in kept] == [0, 0, 1, 1]
    # the second draw's second varied group was played and not trained, as the first draw's uniform one
    assert metrics == {"sampling_draws": 1.0, "groups_dropped": 2.0, "groups_short": 0.0}


def test_dynamic_sampling_refuses_groups_of_one_and_advantages_not_from_the_env_reward_alone(config):
    with pytest.raises(ConfigError, match="group_size=1 makes groups of one"):
        run_rl(config("algorithm.dynamic_sampling=true", "group_size=1"), console=QUIET)
    with pytest.raises(ConfigError, match="also come from the teacher's per-token reward"):
        run_rl(config("algorithm.dynamic_sampling=true", "algorithm.teacher=tiny"), console=QUIET)
    with pytest.raises(ConfigError, match="also come from a critic's values"):
        run_rl(config("algorithm.dynamic_sampling=true", algo="ppo"), console=QUIET)
    # a group whose samples all scored alike still moves the policy under these: dropping it would lose that
    for estimator in ("reinforce_plus_plus", "remax"):
        with pytest.raises(ConfigError, match=f"advantage={estimator} gives such a group advantages of up to"):
            run_rl(config("algorithm.dynamic_sampling=true", f"algorithm.advantage={estimator}"), console=QUIET)


@pytest.mark.parametrize(
    "setting, message",
    [
        ("algorithm.loss_agg_mode=bogus", "algorithm.loss_agg_mode 'bogus' is unknown"),
        ("algorithm.clip_ratio_low=1.5", "algorithm.clip_ratio_low must be in [0.0, 1.0], got 1.5"),
        ("algorithm.rollout_correction=token_tis algorithm.rollout_is_cap=0", "rollout_is_cap must be >= 1.0"),
        ("algorithm.loss_norm_tokens=-5", "algorithm.loss_norm_tokens must be >= 0, got -5"),
        ("algorithm.kl_coef=-0.1", "algorithm.kl_coef must be >= 0.0"),  # it turned the KL off
        ("algorithm.value_clip=nan", "algorithm.value_clip must be >= 0.0, got nan"),  # it turned clipping off
        ("algorithm.value_coef=-1", "algorithm.value_coef must be >= 0.0"),  # the critic learned to err
        ("algorithm.kl_coef=inf", "algorithm.kl_coef must be a finite number"),
    ],
)
def test_an_algorithm_setting_out_of_range_is_refused_before_any_rollout(config, setting, message, monkeypatch):
    """Each was refused only at the first update, or never; a run whose first steps were all skipped
    exited 0 with it."""
    played = []
    monkeypatch.setattr(OnlineRun, "play", lambda self, step: played.append(step))
    with pytest.raises(ConfigError, match=re.escape(message)):
        run_rl(config(*setting.split()), console=QUIET)
    assert played == []


def test_dpo_refuses_a_beta_that_is_not_a_positive_number(config):
    with pytest.raises(ConfigError, match=re.escape("algorithm.dpo_beta must be > 0.0, got nan")):
        run_rl(config("algorithm.dpo_beta=nan", algo="dpo"), console=QUIET)


def test_dpo_refuses_what_it_would_ignore(config):
    with pytest.raises(ConfigError, match="algorithm.kl_target is for the grpo and ppo recipes"):
        run_rl(config("algorithm.kl_target=0.01", "algorithm.kl_coef=0.1", algo="dpo"), console=QUIET)


def test_dpo_warns_of_the_grpo_and_ppo_settings_it_does_not_read(config):
    """--algo dpo with algorithm.policy_loss=gspo ran with DPO's own loss and said nothing."""
    from omrl.training.config_checks import check_config

    with pytest.warns(
        UserWarning, match=r"reads algorithm.dpo_beta alone .* algorithm.policy_loss='gspo', ppo_epochs=3"
    ):
        check_config(config("algorithm.policy_loss=gspo", "ppo_epochs=3", algo="dpo"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # dpo_beta and the dpo recipe's own settings: nothing to warn of
        check_config(config("algorithm.dpo_beta=0.2", algo="dpo"))


def test_critic_and_kl_settings_a_run_would_ignore_are_warned_of(config):
    """grpo with algorithm.critic=model, and kl_in_reward with kl_coef 0 (verl's coefficient is not 0 by
    default), ran as without them and said nothing."""
    from omrl.training.config_checks import check_config

    with pytest.warns(
        UserWarning, match=r"algorithm.critic, algorithm.value_coef set the ppo recipe's critic, and this grpo run"
    ):
        check_config(config("algorithm.critic=model", "algorithm.value_coef=2"))
    with pytest.warns(
        UserWarning,
        match=r"algorithm.kl_in_reward, algorithm.kl_estimator shape a KL to the reference, which algorithm.kl_coef=0",
    ):
        check_config(config("algorithm.kl_in_reward=true", "algorithm.kl_estimator=k1"))
    with pytest.warns(UserWarning, match=r"algorithm.dpo_beta=0.5 is the dpo recipe's, and this grpo run does not"):
        check_config(config("algorithm.dpo_beta=0.5"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # each read: a KL with its coefficient, a critic under ppo
        check_config(config("algorithm.kl_in_reward=true", "algorithm.kl_coef=0.1"))
        check_config(config("algorithm.critic=model", algo="ppo"))


def test_a_tree_estimator_on_the_chain_rollout_is_warned_of(config):
    """tree_grpo on chains gave grpo's metrics to the digit, its tree settings unread, and said nothing."""
    from omrl.training.config_checks import check_config

    with pytest.warns(UserWarning, match=r"algorithm.advantage=tree_grpo reads a search's trees, and this run plays"):
        check_config(config("algorithm.advantage=tree_grpo"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # on a search's trees it reads them
        check_config(config("algorithm.advantage=tree_grpo", "rollout.strategy=beam", "rollout.budget=64"))


def test_batch_sizes_an_online_step_would_ignore_are_warned_of(config):
    from omrl.training.config_checks import check_config

    with pytest.warns(UserWarning, match=r"gradient_accumulation_steps=4 is read by omrl sft and omrl rm train alone"):
        check_config(config("optim.gradient_accumulation_steps=4"))
    with pytest.warns(UserWarning, match=r"mini_batch_size=64 is more than the 6 episodes a step plays"):
        check_config(config("mini_batch_size=64", "tasks_per_step=2", "group_size=3"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_config(config("mini_batch_size=6", "tasks_per_step=2", "group_size=3"))


# -- ReMax ------------------------------------------------------------------------------------------------


def test_remax_compares_each_sample_with_a_greedy_episode_of_its_task(config):
    cfg = config("algorithm.advantage=remax", "steps=1")
    run_rl(cfg, console=QUIET)
    record = read_metrics(cfg.logging.output_dir)[0]
    assert record["greedy_env_errors"] == 0
    episodes = rollout(cfg, 1)
    # the sample-index reward gives the greedy episode index 0, so each sample's advantage is its index
    assert record["greedy_score"] == 0.0
    for ep in episodes:
        trained = [a for a, m in zip(ep.advantages, ep.loss_mask) if m]
        assert trained and all(a == pytest.approx(float(ep.sample)) for a in trained)


def test_remax_refuses_a_search_rollout(config):
    with pytest.raises(ConfigError, match="remax compares each sample with a greedy episode"):
        run_rl(config("algorithm.advantage=remax", "rollout.strategy=best_of_n"), console=QUIET)


# -- on-policy distillation -----------------------------------------------------------------------------


@pytest.fixture
def teacher_dir(tiny_model_dir, tmp_path) -> Path:
    """Another model of the student's tokenizer: the tiny model with its weights moved at random."""
    model, tokenizer = load_model(tiny_model_dir)
    generator = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * 3.0 * param.std().clamp(min=0.02))
    out = tmp_path / "teacher"
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


@pytest.mark.slow  # a learning check
def test_distillation_alone_pulls_the_student_toward_its_teacher(config, teacher_dir, tiny_model_dir):
    cfg = config(
        f"algorithm.teacher={teacher_dir}",
        "reward.weights={goal: 0.0}",  # the teacher's reward alone
        "algorithm.advantage=reinforce_plus_plus",
        "algorithm.gamma=0.0",  # each token's own reward: dense
        "steps=30",
        "tasks_per_step=4",
        "optim.learning_rate=3e-3",
    )
    run_rl(cfg, console=QUIET)
    records = read_metrics(cfg.logging.output_dir)
    assert all(record["teacher_kl"] > 0 for record in records[:2])  # the moved weights disagree
    # the exact reverse KL, over the whole vocabulary, at the student's own tokens of step 1
    episodes = rollout(cfg, 1)
    teacher = load_model(str(teacher_dir))[0]
    before = reverse_kl(load_model(tiny_model_dir)[0], teacher, episodes)
    after = reverse_kl(load_model(cfg.logging.output_dir)[0], teacher, episodes)
    assert after < 0.85 * before, (before, after)


def reverse_kl(student, teacher, episodes) -> float:
    """KL(student || teacher) per model token of ``episodes``, exact over the vocabulary."""
    total, tokens = 0.0, 0
    with torch.no_grad():
        for ep in episodes:
            ids = torch.tensor([ep.token_ids])
            log_p = student(ids).logits[0, :-1].log_softmax(-1)
            log_q = teacher(ids).logits[0, :-1].log_softmax(-1)
            kl = (log_p.exp() * (log_p - log_q)).sum(-1)
            mask = torch.tensor(ep.loss_mask[1:], dtype=torch.bool)  # position t predicts token t + 1
            total += float(kl[mask].sum())
            tokens += int(mask.sum())
    return total / tokens


def test_a_teacher_with_another_tokenizer_is_refused(config, tiny_model_dir, tmp_path):
    model, tokenizer = load_model(tiny_model_dir)
    tokenizer.add_tokens(["<only_the_teacher_has_this>"])
    other = tmp_path / "other"
    model.save_pretrained(other)
    tokenizer.save_pretrained(other)
    with pytest.raises(ConfigError, match="has another tokenizer than the student"):
        run_rl(config(f"algorithm.teacher={other}"), console=QUIET)


# -- the constant loss normaliser ------------------------------------------------------------------------


def test_an_env_whose_turn_cap_is_per_instance_trains_and_the_normaliser_then_asks_for_one(config, register_plugin):
    """Client envs (agentgym, openenv) learn their turn cap from their server: a property, no class number."""
    from omrl import registry

    class PerInstanceCap(registry.envs.get("gridworld")):
        """gridworld whose turn cap is known only per instance, as a client env's."""

        @property
        def max_turns(self):
            return self._cap

        @max_turns.setter
        def max_turns(self, value):
            self._cap = value

    register_plugin(EnvPlugin("per-instance-cap", PerInstanceCap), name="per-instance-cap")
    run_rl(config("env.name=per-instance-cap", "env.max_turns=0", "steps=1", out="plain"), console=QUIET)
    norm = config("env.name=per-instance-cap", "env.max_turns=0", "algorithm.loss_agg_mode=seq-mean-token-sum-norm")
    with pytest.raises(ConfigError, match="declares no turn cap of its own; set env.max_turns, or algorithm.loss_norm"):
        run_rl(norm, console=QUIET)


def test_seq_mean_token_sum_norm_divides_by_the_runs_token_budget(config):
    assert episode_token_budget(config()) == 8 * 2  # max_new_tokens x env.max_turns
    summed = config("algorithm.loss_agg_mode=token-sum", "steps=1", out="sum")
    normed = config("algorithm.loss_agg_mode=seq-mean-token-sum-norm", "steps=1", out="norm")
    run_rl(summed, console=QUIET)
    run_rl(normed, console=QUIET)
    rows = sum(any(ep.loss_mask) for ep in rollout(normed, 1))
    total = read_metrics(summed.logging.output_dir)[0]["pg_loss"]
    assert read_metrics(normed.logging.output_dir)[0]["pg_loss"] == pytest.approx(total / (rows * 16), rel=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["token-sum", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_the_logged_loss_does_not_move_with_the_micro_batch_size(config, mode):
    """The gradient of a micro-batch is weighed by its share under the mode; its logged figures too."""
    runs = [
        config(
            f"algorithm.loss_agg_mode={mode}",
            "steps=1",
            "algorithm.kl_coef=0.05",
            f"optim.micro_batch_size={size}",
            "optim.share_prefix=false",
            out=f"mb{size}",
        )
        for size in (1, 8)
    ]
    for cfg in runs:
        run_rl(cfg, console=QUIET)
    one, eight = (read_metrics(cfg.logging.output_dir)[0] for cfg in runs)
    for key in ("loss", "pg_loss", "entropy", "kl", "grad_norm"):
        assert one[key] == pytest.approx(eight[key], rel=1e-4), key
