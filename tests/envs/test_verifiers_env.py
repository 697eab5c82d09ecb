"""verifiers environments (``verifiers:<module>``) played in omrl's own loop: single-turn, multi-turn and tool
environments written as verifiers' docs write them (tests/envs/verifiers_envs/), and verifiers' own packaged
ReasoningGymEnv. Each is played through the rollout with scripted replies: token-exact, scored as verifiers itself
scores the same replies, its state kept across turns; and what omrl cannot honour is refused, naming it."""

from __future__ import annotations

import asyncio
import importlib
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("verifiers.legacy", reason="needs verifiers 0.3 (pip install 'omrl[verifiers]')")

import verifiers.legacy as vf  # noqa: E402

from omrl import registry  # noqa: E402
from omrl.chat import encode_conversation  # noqa: E402
from omrl.chat.encoding import encode_plain  # noqa: E402
from omrl.chat.tool_calls import call_text  # noqa: E402
from omrl.envs import EpisodeFinishedError, UnknownTaskError, create_env  # noqa: E402
from omrl.errors import ConfigError  # noqa: E402
from omrl.evaluation import evaluate  # noqa: E402
from omrl.rewards import RewardError, compose_rewards  # noqa: E402
from omrl.rollout import EnvPool, RolloutLimits, collect, token_exact  # noqa: E402
from omrl_plugins.envs import verifiers as plugin  # noqa: E402
from tests.envs.verifiers_envs import sums  # noqa: E402
from tests.fakes import ScriptedBackend  # noqa: E402
from tests.helpers import cli_exit  # noqa: E402

ENVS = "tests.envs.verifiers_envs"
REPO = Path(__file__).resolve().parents[2]
LIMITS = RolloutLimits(max_new_tokens=64, max_context=2048)


@pytest.fixture
def verifiers_plugin(register_plugin):
    """The plugin module, registered as its entry point registers it (unless the entry point already did)."""
    from omrl.plugins import load_plugins

    if not load_plugins().is_registered(plugin):
        register_plugin(plugin, name="omrl.envs.verifiers")
    return plugin


def rollout(tokenizer, module: str, replies, tasks=(0,), args=None, **options):
    """The episodes of ``tasks`` of ``module``'s environment through the rollout, the model's replies scripted
    (``replies[i][turn]`` for the i-th task)."""
    pool = EnvPool(plugin.variant(f"{ENVS}.{module}"), {"args": args or {}, **options}, name=f"verifiers:{module}")
    backend = ScriptedBackend(tokenizer, lambda call, i, prompt: sampled(tokenizer, replies[i][call]))
    try:
        episodes = collect(pool, plugin.VerifiersTemplate(), tokenizer, list(tasks), backend=backend, limits=LIMITS)
    finally:
        pool.close()
    return episodes


def sampled(tokenizer, reply: str) -> list[int]:
    """The ids of a reply as a model samples them: its text, never special tokens (the tiny tokenizer's
    ``<tool_call>`` is one), then the end-of-turn token."""
    return encode_plain(tokenizer, reply) + [tokenizer.eos_token_id]


def assert_token_exact(tokenizer, ep, replies):
    """The rollout's ids: each turn's ids are the reply's ids as sampled (masked in), and the whole episode
    re-encodes, as SFT encodes it, to the same ids and mask."""
    assert token_exact(ep)
    for turn, reply in zip(ep.turns, replies):
        ids = ep.token_ids[slice(*turn.span)]
        assert ids == sampled(tokenizer, reply)
        assert all(ep.loss_mask[i] for i in range(*turn.span))
    assert sum(ep.loss_mask) == sum(b - a for a, b in (t.span for t in ep.turns))
    ids, mask = encode_conversation(tokenizer, ep.messages, **ep.chat_kwargs)
    assert ids[: len(ep.token_ids)] == ep.token_ids and mask[: len(ep.loss_mask)] == ep.loss_mask


class ScriptedClient(vf.Client):
    """A verifiers client answering with the given assistant messages, for verifiers' own rollout."""

    def __init__(self, messages):
        super().__init__(None)
        self.messages = list(messages)

    async def get_response(self, prompt, model, sampling_args, tools=None, **kwargs):
        return vf.Response(id="scripted", created=0, model=model, message=self.messages.pop(0))

    def setup_client(self, config):
        return None

    async def to_native_tool(self, tool):
        return tool

    async def to_native_prompt(self, messages):
        return messages, {}

    async def get_native_response(self, prompt, model, sampling_args, tools=None, **kwargs):
        raise NotImplementedError

    async def raise_from_native_response(self, response):
        return None

    async def from_native_response(self, response):
        return response

    async def close(self):
        return None


def said(content=None, calls=()):
    """An assistant message as a serving engine hands it to verifiers: text and structured tool calls."""
    tool_calls = [
        vf.ToolCall(id=f"c{i}", name=name, arguments=json.dumps(args)) for i, (name, args) in enumerate(calls)
    ]
    return vf.ResponseMessage(content=content, tool_calls=tool_calls or None, finish_reason="stop", is_truncated=False)


def verifiers_scores(module: str, row: int, messages, split="train", **args):
    """The reward and metrics verifiers itself gives the rollout of dataset row ``row`` with these replies."""
    env = importlib.import_module(f"{ENVS}.{module}").load_environment(**args)
    rows = env.get_dataset() if split == "train" else env.get_eval_dataset()
    state = asyncio.run(env._run_rollout_state(dict(rows[row]), ScriptedClient(messages), "scripted", {}))
    return state["reward"], dict(state["metrics"])


def hermes(name, **arguments):
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


# -- registering and finding environments ----------------------------------------------------------------------
def test_registering_imports_nothing_and_finds_installed_environment_packages(tmp_path):
    """An environment package (a distribution that needs verifiers, its module with load_environment) is
    registered as verifiers:<module> from its metadata; a package that needs verifiers only as an extra, or
    whose module has no load_environment, is not."""

    def dist(name, module, requires, source):
        info = tmp_path / f"{name.replace('-', '_')}-0.1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1.0\nRequires-Dist: {requires}\n"
        )
        (info / "RECORD").write_text(f"{module}.py,,\n{info.name}/METADATA,,\n")
        (tmp_path / f"{module}.py").write_text(source)

    dist("tiny-vf-env", "tiny_vf_env", "verifiers>=0.3.1", f"from {ENVS}.sums import load_environment\n")
    dist("with-extra", "with_extra", 'verifiers; extra == "vf"', "def load_environment(): ...\n")
    dist("no-loader", "no_loader", "verifiers", "X = 1\n")
    code = textwrap.dedent(
        f"""
        import json, sys
        sys.path[:0] = [{str(tmp_path)!r}, {str(REPO)!r}]
        from omrl_plugins.envs import verifiers as plugin
        names = []
        plugin.register_envs(lambda name, cls: names.append(name))
        print(json.dumps({{"names": names, "imported": "verifiers" in sys.modules}}))
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["names"][0] == "verifiers" and "verifiers:tiny_vf_env" in seen["names"]
    assert not {"verifiers:with_extra", "verifiers:no_loader"} & set(seen["names"]) and not seen["imported"]


def test_an_installed_package_plays_by_its_name(verifiers_plugin, tmp_path, monkeypatch):
    info = tmp_path / "tiny_vf_env-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: tiny-vf-env\nVersion: 0.1.0\nRequires-Dist: verifiers\n"
    )
    (info / "RECORD").write_text("tiny_vf_env.py,,\n")
    (tmp_path / "tiny_vf_env.py").write_text(f"from {ENVS}.sums import load_environment\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    plugin.installed_environments.cache_clear()
    try:
        env_class = registry.envs.get("verifiers:tiny_vf_env")
        assert (env_class.package, env_class.extra) == ("verifiers", "verifiers")
        env = create_env(env_class, {"args": {"num_train": 2}}, "verifiers:tiny_vf_env")
        try:
            assert list(env.task_ids("train")) == [0, 1] and env.reset(0).text == "What is 1 + 2?"
            assert env.step("<think>1 and 2</think>\n<answer>3</answer>").won
        finally:
            env.close()
    finally:
        plugin.installed_environments.cache_clear()
    assert registry.envs.get("verifiers") is plugin.VerifiersEnv
    assert registry.templates.get("verifiers_reply") is plugin.VerifiersTemplate
    assert registry.rewards.get("verifiers_rubric") is plugin.verifiers_reward


# -- playing them --------------------------------------------------------------------------------------------------
def test_single_turn_env_is_token_exact_and_scored_by_its_rubric(tiny_tokenizer):
    right, wrong = "<think>1 and 2 make 3</think>\n<answer>3</answer>", "It is 5."
    episodes = rollout(tiny_tokenizer, "sums", [[right], [wrong]], tasks=[0, 1])
    for ep, reply in zip(episodes, [right, wrong]):
        assert ep.end_reason == "done" and ep.num_turns == 1
        assert_token_exact(tiny_tokenizer, ep, [reply])
        # the prompt as verifiers sends it: its system prompt, then the question
        assert ep.messages[:2] == [
            {"role": "system", "content": sums.SYSTEM_PROMPT},
            {"role": "user", "content": ep.instruction},
        ]
    good, bad = episodes
    assert good.instruction == "What is 1 + 2?" and bad.instruction == "What is 2 + 3?"
    # the rubric's reward (1.0 x correct + 0.2 x format), as verifiers itself scores the same replies
    for ep, row, reply in [(good, 0, right), (bad, 1, wrong)]:
        info = ep.turns[-1].info
        reward, metrics = verifiers_scores("sums", row, [said(reply)])
        assert ep.turns[-1].reward == info["verifiers_reward"] == pytest.approx(reward)
        assert {k: v for k, v in info["verifiers_metrics"].items() if k != "parser_format"} == pytest.approx(metrics)
    assert good.turns[-1].reward == pytest.approx(1.2) and good.won and good.score == 1.0
    assert bad.turns[-1].reward == pytest.approx(0.2 * 0.2) and not bad.won  # XMLParser's credit for spacing
    assert good.turns[-1].info["answer"] == "3" and good.turns[-1].info["stop_condition"] == "max_turns_reached"
    # format_ok and parser_format: the parser's format reward (XMLParser's: 1.0 for the tagged reply)
    assert good.turns[0].format_ok and not bad.turns[0].format_ok
    assert good.turns[-1].info["verifiers_metrics"]["parser_format"] == 1.0


def test_multi_turn_game_keeps_its_state_and_ends_by_its_own_stop_condition(tiny_tokenizer):
    replies = ["10", "I guess 5", "seven?", "7"]
    (ep,) = rollout(tiny_tokenizer, "guess", [replies])  # secret 7
    assert ep.end_reason == "done" and ep.num_turns == 4 and ep.won
    assert_token_exact(tiny_tokenizer, ep, replies)
    # the environment's answers: its state (every guess so far) kept from turn to turn
    assert [t.observation for t in ep.turns[1:]] == [
        "Guess 1 (10): go lower.",
        "Guess 2 (10, 5): go higher.",
        "Reply with one number.",
    ]
    last = ep.turns[-1].info
    assert last["stop_condition"] == "has_final_env_response"
    assert last["verifiers_metrics"] == {"solved": 1.0, "guesses_used": 3.0, "num_turns": 4.0}
    reward, metrics = verifiers_scores("guess", 0, [said(r) for r in replies])
    assert (ep.turns[-1].reward, last["verifiers_metrics"]) == (reward, metrics)
    assert [t.reward for t in ep.turns] == [0.0, 0.0, 0.0, 1.0]


def test_a_game_cut_by_its_own_max_turns_is_scored_too(tiny_tokenizer):
    (ep,) = rollout(tiny_tokenizer, "guess", [["1", "2"]], args={"max_turns": 2})
    assert ep.end_reason == "done" and ep.num_turns == 2 and not ep.won
    assert ep.turns[-1].info["stop_condition"] == "max_turns_reached"
    assert ep.turns[-1].info["verifiers_metrics"]["guesses_used"] == 1.0  # the second guess was never answered


def test_tool_env_runs_python_functions_as_tools(tiny_tokenizer):
    replies = [
        "I will add them.\n" + hermes("add", a=17, b=25),
        hermes("capital", country="Mars"),  # the tool raises: its error is the answer, the episode goes on
        "42",
    ]
    (ep,) = rollout(tiny_tokenizer, "calculator", [replies])
    assert ep.end_reason == "done" and ep.num_turns == 3 and ep.won
    assert_token_exact(tiny_tokenizer, ep, replies)
    offered = [tool["function"]["name"] for tool in ep.chat_kwargs["tools"]]
    assert offered == ["add", "capital"]  # the tools reach the chat template
    assert [t.observation for t in ep.turns[1:]] == ["42", "'Mars'"]
    infos = [t.info for t in ep.turns]
    assert [i.get("tool") for i in infos] == ["add", "capital", None]
    assert [i.get("tool_error") for i in infos] == [False, True, None]
    assert infos[0]["tool_calls"] == [{"status": "ok", "name": "add"}]
    metrics = evaluate([ep])
    assert metrics["tool_call_rate"] == 1.0 and metrics["valid_tool_call_rate"] == 0.5
    assert metrics["valid_call_turn_rate"] == pytest.approx(2 / 3)
    reward, own = verifiers_scores(
        "calculator",
        0,
        [
            said("I will add them.", [("add", {"a": 17, "b": 25})]),
            said(None, [("capital", {"country": "Mars"})]),
            said("42"),
        ],
    )
    assert ep.turns[-1].reward == reward == 1.0
    assert ep.turns[-1].info["verifiers_metrics"] == own
    assert own["total_tool_calls"] == 2.0 and own["add_calls"] == 1.0


def test_omrls_tool_call_template_calls_the_same_tools(tiny_tokenizer):
    """With omrl's tool_call template the env gets each parsed call (a reply without one does not parse, so the
    episode ends at the environment's own max_turns)."""
    call = '<tool_call>\n{"name": "add", "arguments": {"a": 17, "b": 25}}\n</tool_call>'
    pool = EnvPool(plugin.variant(f"{ENVS}.calculator"), name="verifiers:calculator")
    backend = ScriptedBackend(tiny_tokenizer, lambda call_index, i, prompt: sampled(tiny_tokenizer, call))
    try:
        template = registry.templates.get("tool_call")()
        (ep,) = collect(pool, template, tiny_tokenizer, [0], backend=backend, limits=LIMITS)
    finally:
        pool.close()
    assert [t.action for t in ep.turns] == [call_text("add", {"a": 17, "b": 25})] * 4
    assert [t.observation for t in ep.turns[1:]] == ["42"] * 3 and all(t.format_ok for t in ep.turns)
    assert ep.end_reason == "done" and ep.turns[-1].info["stop_condition"] == "max_turns_reached"
    assert ep.turns[-1].info["verifiers_metrics"]["add_calls"] == 4.0


def test_stateful_tool_env_keeps_hidden_state_between_calls(tiny_tokenizer):
    replies = [hermes("remember", text="pelican"), hermes("recall"), "pelican"]
    (ep,) = rollout(tiny_tokenizer, "notes", [replies])
    assert_token_exact(tiny_tokenizer, ep, replies)
    assert [t.observation for t in ep.turns[1:]] == ["noted (1 notes)", "pelican"]
    # the hidden argument (the rollout's notes) is not offered to the model
    (remember,) = [t["function"] for t in ep.chat_kwargs["tools"] if t["function"]["name"] == "remember"]
    assert list(remember["parameters"]["properties"]) == ["text"]
    assert ep.won and ep.turns[-1].reward == 1.0


def test_verifiers_own_reasoning_gym_env(tiny_tokenizer):
    from tests.envs.verifiers_envs import arithmetic

    env = arithmetic.load_environment()
    entries = [env.rg_dataset[int(row["answer"])] for row in env.get_eval_dataset()]
    answers = [entries[0]["answer"], "7"]
    replies = [[f"<answer>{answer}</answer>"] for answer in answers]
    episodes = rollout(tiny_tokenizer, "arithmetic", replies, tasks=[1_000_000, 1_000_001])
    # the dataset's own scorer is the reward (basic_arithmetic gives partial credit)
    expected = [env.rg_dataset.score_answer(answer, entry) for answer, entry in zip(answers, entries)]
    assert [ep.turns[-1].reward for ep in episodes] == expected and expected[0] == 1.0 > expected[1]
    assert episodes[0].won and episodes[1].won == (expected[1] >= env.pass_threshold)
    assert episodes[0].messages[0]["content"].startswith("Given a problem, your task is to answer")
    for ep, reply in zip(episodes, replies):
        assert_token_exact(tiny_tokenizer, ep, reply)


def test_splits_are_the_dataset_and_the_eval_dataset():
    env = create_env(plugin.variant(f"{ENVS}.sums"), {"args": {"num_train": 3, "num_eval": 2}})
    try:
        assert env.splits == ("train", "test")
        assert list(env.task_ids("train")) == [0, 1, 2]
        assert list(env.task_ids("test")) == [1_000_000, 1_000_001]
        assert env.reset(2).text == "What is 3 + 4?" and env.reset(1_000_001).text == "What is 101 + 102?"
        with pytest.raises(UnknownTaskError, match=r"unknown task id 3; valid: train 0..2, test 1000000..1000001"):
            env.reset(3)
    finally:
        env.close()
    only_eval = create_env(plugin.VerifiersEnv, {"module": f"{ENVS}.unsupported", "args": {"kind": "eval_only"}})
    try:
        assert only_eval.splits == ("test",)
        with pytest.raises(UnknownTaskError, match=r"no split 'train' \(its environment has no dataset\); valid: test"):
            only_eval.split_of("train")
    finally:
        only_eval.close()


# -- what omrl cannot honour ---------------------------------------------------------------------------------------
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # verifiers' SandboxEnv, on tenacity's new API
@pytest.mark.parametrize(
    "kind,why",
    [
        ("judge", r"its rubric JudgeRubric asks a judge model \(judge-1\) over the network"),
        ("group", r"its reward functions diversity score a group of rollouts together"),
        ("sandbox", r"SandboxEnv needs Prime Intellect's sandbox service"),
        ("user_model", r"the environment holds AsyncOpenAI 'user_client': it calls a model over the network"),
    ],
)
def test_what_omrl_cannot_play_is_refused_naming_it(kind, why):
    with pytest.raises(ConfigError, match=f"cannot be played by omrl: {why}"):
        create_env(plugin.VerifiersEnv, {"module": f"{ENVS}.unsupported", "args": {"kind": kind}})


def test_a_module_beside_the_user_loads_as_an_agents_does(tmp_path, monkeypatch):
    """docs/verifiers.md's own sums module, saved in the folder omrl runs from, was 'no module' without PYTHONPATH."""
    import importlib.util
    import sys

    source = importlib.util.find_spec(f"{ENVS}.sums").origin
    (tmp_path / "my_sums_beside.py").write_text(open(source).read())
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    env = create_env(plugin.VerifiersEnv, {"module": "my_sums_beside"})
    assert env.task_ids("train")


@pytest.mark.parametrize(
    "options,why",
    [
        ({"module": "no_such_env_module"}, r"no module 'no_such_env_module' \(install the environment's package"),
        ({"module": ""}, r"verifiers: module='' is not a module name; valid: an importable module with load_env"),
        (
            {"module": 5},
            r"verifiers: module=5 is not a module name; valid: .* or an environment id \(owner/vf-wordle\)",
        ),
        ({"module": ".relative"}, r"verifiers: module='.relative' is not a module name"),
        ({"module": "json"}, r"module 'json' has no load_environment\(\)"),
        ({"module": f"{ENVS}.sums", "args": {"turns": 3}}, r"does not take args \['turns'\].*num_train, num_eval"),
        ({"module": f"{ENVS}.unsupported", "args": {"kind": "x"}}, r"load_environment\(kind='x'\) failed: ValueError"),
        ({"module": f"{ENVS}.sums", "tool_format": "xml"}, r"unknown tool_format 'xml'; valid: hermes, json"),
        ({"module": f"{ENVS}.sums", "timeout_s": True}, r"option timeout_s=True is invalid; valid: a positive number"),
        ({"module": f"{ENVS}.sums", "timeout_s": float("inf")}, r"option timeout_s=inf is invalid"),
        ({"module": f"{ENVS}.sums", "timeout_s": 0}, r"option timeout_s=0 is invalid"),
    ],
)
def test_a_bad_module_or_option_is_a_config_error(options, why):
    with pytest.raises(ConfigError, match=why):
        create_env(plugin.VerifiersEnv, options)


def test_failures_in_the_environment_end_the_episode_as_env_error(tiny_tokenizer):
    def one(kind, replies, **options):
        return rollout(tiny_tokenizer, "unsupported", [replies], args={"kind": kind}, **options)[0]

    raising = one("raising_reward", ["yes"])
    assert raising.end_reason == "env_error"
    assert (
        "a reward function failed (needs_a_server: ConnectionError: no route to the scoring service)" in raising.error
    )
    zero = one("raising_reward", ["yes"], reward_errors="zero")  # verifiers' own rule: it scores 0
    assert zero.end_reason == "done" and zero.turns[-1].reward == 1.0
    assert zero.turns[-1].info["reward_errors"] == ["needs_a_server: ConnectionError: no route to the scoring service"]
    broken = one("broken_turn", ["yes", "yes"])
    assert broken.end_reason == "env_error" and "failed: RuntimeError: the game engine crashed" in broken.error
    rewritten = one("rewrite", ["yes", "yes"])
    assert rewritten.end_reason == "env_error" and "rewrote the conversation" in rewritten.error
    slow = one("slow_turn", ["yes", "yes"], timeout_s=1)
    assert slow.end_reason == "env_error" and "did not answer the model's reply within 1 s" in slow.error
    image = one("image", ["yes"])
    assert (
        image.end_reason == "env_error"
        and "prompt holds a part of type 'image_url'; omrl plays text only" in image.error
    )


@pytest.mark.parametrize(
    "kind,shown", [("none_reward", "None"), ("nan_reward", "nan"), ("inf_reward", "inf"), ("text_reward", "'1.0'")]
)
def test_a_reward_function_that_returns_no_number_is_a_failure_never_a_silent_0(tiny_tokenizer, kind, shown):
    """verifiers' float() of the value is outside the call it catches errors of: None would score 0 unnoticed."""
    failure = f"counts_nothing returned {shown}, not a finite number"
    raised = rollout(tiny_tokenizer, "unsupported", [["yes"]], args={"kind": kind})[0]
    assert raised.end_reason == "env_error" and f"a reward function failed ({failure})" in raised.error
    zero = rollout(tiny_tokenizer, "unsupported", [["yes"]], args={"kind": kind}, reward_errors="zero")[0]
    assert zero.end_reason == "done" and zero.turns[-1].reward == 1.0  # said_yes's 1, the failed function's 0
    assert zero.turns[-1].info["reward_errors"] == [failure]
    assert zero.turns[-1].info["verifiers_metrics"]["counts_nothing"] == 0.0


def test_stepping_without_an_episode_and_ending_one_early():
    env = create_env(plugin.variant(f"{ENVS}.guess"))
    game = env.env
    with pytest.raises(EpisodeFinishedError, match="no episode in progress"):
        env.step("3")
    env.reset(0)
    env.step("10")
    env.end_episode()  # cut short (omrl's turn cap): the rollout is cancelled and its cleanup runs
    assert game.cleaned_up == 1
    with pytest.raises(EpisodeFinishedError, match="no episode in progress"):
        env.step("3")
    assert env.reset(0).text.startswith("I picked a number")
    assert env.step("7").won and game.cleaned_up == 2
    assert not game.torn_down
    env.close()  # the environment's teardown
    assert game.torn_down


# -- the reward ------------------------------------------------------------------------------------------------------
def test_the_verifiers_reward_is_the_rubric_reward_or_one_metric(tiny_tokenizer, verifiers_plugin):
    episodes = rollout(
        tiny_tokenizer, "sums", [["<answer>3</answer>"], ["<think>.</think>\n<answer>0</answer>"]], [0, 1]
    )
    means = compose_rewards(episodes, {"verifiers_rubric": 1.0, "goal": 0.0})
    assert [ep.rewards["verifiers_rubric"][-1] for ep in episodes] == [
        ep.turns[-1].info["verifiers_reward"] for ep in episodes
    ]
    assert means["verifiers_rubric"] == pytest.approx(sum(ep.turns[-1].reward for ep in episodes) / 2)
    compose_rewards(episodes, {"verifiers_rubric": 1.0}, {"verifiers_rubric": {"metric": "correct_answer"}})
    assert [ep.rewards["verifiers_rubric"][-1] for ep in episodes] == [1.0, 0.0]
    with pytest.raises(RewardError, match=r"has no metric 'nope'; its metrics: correct_answer, format_reward_func"):
        compose_rewards(episodes, {"verifiers_rubric": 1.0}, {"verifiers_rubric": {"metric": "nope"}})
    other = episodes[0]
    other.turns[-1].info = {"won": True, "score": 1.0}
    with pytest.raises(RewardError, match="has no verifiers score"):
        compose_rewards([other], {"verifiers_rubric": 1.0})


# -- the command line ----------------------------------------------------------------------------------------------
def test_omrl_eval_plays_a_verifiers_env_with_the_tiny_model(verifiers_plugin, capsys, tmp_path):
    code, out, err = cli_exit(
        capsys,
        "eval",
        "--env",
        "verifiers",
        "--model",
        "tiny",
        "--num-tasks",
        "2",
        "--split",
        "train",
        "--output-dir",
        str(tmp_path),
        "env.template=verifiers_reply",
        f"plugins.verifiers.module={ENVS}.guess",
        "plugins.verifiers.args.max_turns=2",
        "generation.max_new_tokens=6",
        "reward.weights={verifiers_rubric: 1.0}",
    )
    assert code == 0, out + err
    report = json.loads((tmp_path / "report.json").read_text())
    metrics = report["metrics"]
    assert metrics["episodes"] == 2 and metrics["not_token_exact"] == 0
    # every episode ends by the game's own cap (args.max_turns=2), scored by its rubric
    assert metrics["end_reasons"] == {"done": 2} and metrics["mean_turns"] == 2.0
    assert "reward/verifiers_rubric" in metrics
    assert [ep["task_id"] for ep in report["episodes"]] == [0, 1]
