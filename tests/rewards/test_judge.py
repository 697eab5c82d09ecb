"""The ``judge`` reward (LLM-as-judge): a local `tiny` judge, and a loopback OpenAI-compatible server
whose chat completions are scripted (verdicts, rankings, garbage, HTTP errors, a hang)."""

from __future__ import annotations

import json
import time

import pytest

from omrl.data import Episode, Turn, read_episodes
from omrl.errors import ConfigError
from omrl.rewards import compose_rewards
from omrl.training.metrics import rollout_metrics
from omrl_plugins.rewards import judge_calls
from omrl_plugins.rewards.judge import GROUP_PLACEHOLDERS, PLACEHOLDERS, judge_reward
from tests.fakes import ScriptedBackend
from tests.helpers import FAST, cli_exit, keys_rollout
from tests.rewards.judge_server import KEY


def episode(task: str, answer: str, truth: str | None = "42", group: int = 0, sample: int = 0) -> Episode:
    """Two turns: a look around, then ``answer[<answer>]`` (its info holds ``truth`` as the ground truth)."""
    info = {} if truth is None else {"ground_truth": truth}
    turns = [
        Turn("You are in a library.", "Action: look", "look", True, 0.0, False),
        Turn("A book lies open.", f"Action: answer[{answer}]", f"answer[{answer}]", True, 0.0, True, info),
    ]
    return Episode(env="fake", task_id=0, split="train", instruction=task, turns=turns, group=group, sample=sample)


def composed(episodes, **options):
    """``compose_rewards`` with the judge alone."""
    return compose_rewards(episodes, {"judge": 1.0}, {"judge": options})


def by_task(**replies):
    """A script answering by which task (a key of ``replies``) the prompt names."""
    return lambda prompt: next(reply for task, reply in replies.items() if f"task {task}" in prompt)


# --- a local judge: `tiny` through the hf backend --------------------------------------------------------


def test_tiny_local_judge_answers_random_text_so_its_episodes_end_as_env_error():
    judge_calls.clear_cache()
    episodes = [episode("Say 42.", "42"), episode("Say 42.", "41")]
    means = composed(episodes, backend="hf", model="tiny", max_tokens=8)
    for ep in episodes:
        assert ep.end_reason == "env_error" and ep.rewards == {"judge": [0.0, 0.0], "total": [0.0, 0.0]}
        assert ep.error.startswith("reward 'judge': judge 'tiny' (hf backend): answered unparseably: no line 'SCORE:")
        assert ep.turns[-1].info["judge"]["reply"]  # what it said, for whoever reads the episode
    assert means == {"judge": 0.0, "total": 0.0}
    assert rollout_metrics(episodes, 1.0, means)["env_errors"] == 2.0


def test_a_local_judge_is_prompted_as_an_endpoint_is_and_its_scripted_verdict_read(judge, tiny_tokenizer, monkeypatch):
    prompts = []

    def reply(call, index, ids):
        prompts.append(tiny_tokenizer.decode(ids))
        return "The answer matches.\nSCORE: 8"

    scripted = ScriptedBackend(tiny_tokenizer, reply)
    monkeypatch.setitem(judge_calls._LOCAL, ("hf", "scripted-judge", "float32", 8), (scripted, tiny_tokenizer))
    ep = episode("Say 42.", "42")
    assert judge_reward([ep], backend="hf", model="scripted-judge") == [[0.0, 0.8]]
    assert ep.turns[-1].info["judge"] == {
        "judge": "'scripted-judge' (hf backend)",
        "score": 0.8,
        "verdict": "8",
        "reasoning": "The answer matches.",
        "cached": False,
    }
    judge_reward([episode("Say 42.", "42")], **judge.options())  # the same episode, to an endpoint
    chat = [{"role": "user", "content": judge.prompts()[0]}]
    assert prompts == [tiny_tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)]


# --- an endpoint judge: verdicts ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "options, reply, score",
    [
        ({}, "It is right.\nSCORE: 7", 0.7),
        ({}, "7", 0.7),
        ({}, "**Final score:** 7/10", 0.7),
        ({"low": 1, "high": 5}, "SCORE: 3.5", 0.625),
        ({"scale": "yes_no"}, "Correct.\nSCORE: yes", 1.0),
        ({"scale": "yes_no"}, "No.", 0.0),
        ({"scale": "likert", "points": 5}, "Mostly right.\nScore: 4", 0.75),
        ({"scale": "likert", "points": 3}, "SCORE: 1", 0.0),
    ],
)
def test_verdicts_are_read_on_the_scale_and_normalised(judge, options, reply, score):
    judge.script = lambda prompt: reply
    ep = episode("Say 42.", "42")
    assert judge_reward([ep], **judge.options(**options)) == [[0.0, score]]
    assert ep.end_reason == "done" and ep.turns[-1].info["judge"]["score"] == score


def test_the_reasoning_is_kept_and_the_key_goes_only_into_the_header(judge):
    judge.script = lambda prompt: "The agent answered 42, which is what was expected.\nSCORE: 9"
    ep = episode("What is six times seven?", "42")
    means = composed([ep], **judge.options(temperature=0.5, max_tokens=64))
    assert means == {"judge": 0.9, "total": 0.9} and ep.rewards["judge"] == [0.0, 0.9]
    assert ep.turns[-1].info["judge"] == {
        "judge": f"'judge-model' at {judge.base_url}",
        "score": 0.9,
        "verdict": "9",
        "reasoning": "The agent answered 42, which is what was expected.",
        "cached": False,
    }
    (request,) = judge.requests
    assert request["authorization"] == f"Bearer {KEY}"
    assert (request["model"], request["temperature"], request["max_tokens"]) == ("judge-model", 0.5, 64)
    prompt = request["messages"][0]["content"]
    assert "# Task\nWhat is six times seven?" in prompt and "# Expected answer\n42" in prompt
    assert "# The agent's final answer\n42" in prompt  # unwrapped from answer[...]
    assert "USER: You are in a library.\n\nASSISTANT: Action: look" in prompt
    assert prompt.endswith("SCORE: <a number from 0 to 10 (10 is best)>")
    assert KEY not in repr(ep) and KEY not in json.dumps(ep.turns[-1].info)


def test_a_last_reply_that_did_not_parse_is_judged_against_the_answer_an_earlier_turn_reported(judge):
    """The last turn of a reply that never reached the env has no ground truth: the judge was told none was given."""
    judge.script = lambda prompt: "SCORE: 0"
    ep = episode("What is six times seven?", "41")
    ep.turns.append(Turn("Incorrect, try again.", "forty... two?", None, False, 0.0, True))
    composed([ep], **judge.options())
    assert "# Expected answer\n42" in judge.prompts()[0]


def test_a_one_turn_reply_that_did_not_parse_is_judged_against_the_answer_the_env_gave_at_reset(
    judge, tiny_tokenizer, tmp_path
):
    """It was judged with "(none given)": a format broken was graded more leniently than a wrong answer."""
    from omrl import registry
    from omrl.rollout.loop import open_episode
    from omrl_plugins.envs.dataset import DatasetEnv

    data = tmp_path / "qa.jsonl"
    data.write_text(json.dumps({"prompt": "What is 3 + 5?", "answer": "8"}) + "\n")
    env = DatasetEnv(path=str(data))
    ep = Episode(env="dataset", task_id=0, split="train", instruction="")
    template = registry.templates.get("react")()
    assert open_episode(ep, env, env.reset(0), template, tiny_tokenizer, "dataset", demonstration=False)
    ep.turns.append(Turn("", "eight, I think", None, False, 0.0, True))  # no action: the env never stepped
    judge.script = lambda prompt: "SCORE: 0"
    composed([ep], **judge.options())
    assert "# Expected answer\n8" in judge.prompts()[0]


def test_a_rubric_of_ones_own_gets_each_placeholder_filled(judge, tmp_path):
    rubric = tmp_path / "rubric.txt"
    rubric.write_text("T={task} E={expected} A={answer} S={scale}\nLAST:\n{last_turn}\n---\n{transcript}")
    ep = episode("Name the book.", "Dune", truth=None)
    judge_reward([ep], **judge.options(rubric_file=str(rubric), scale="yes_no", max_chars=31))
    assert judge.prompts() == [
        "T=Name the book. E=(none given) A=Dune S=yes or no\nLAST:\n"
        "[... the first 25 characters left out ...]\nASSISTANT: Action: answer[Dune]\n---\n"
        "[... the first 101 characters left out ...]\nASSISTANT: Action: answer[Dune]"
    ]


def test_unknown_placeholders_and_bad_options_are_refused_naming_what_is_valid(judge):
    ep = episode("Say 42.", "42")
    with pytest.raises(ConfigError, match=r"unknown placeholders \{answr\}; valid: \{task\}, \{expected\}, \{answer\}"):
        judge_reward([ep], **judge.options(rubric="{answr} SCORE: {scale}"))
    with pytest.raises(ConfigError, match=r"group rubric \(group=true\) has unknown placeholders \{answer\}"):
        judge_reward([ep], **judge.options(rubric="{answer} {trajectories}", group=True))
    for bad, message in [
        ({"scale": "stars"}, "scale='stars' is invalid; valid: number"),
        ({"low": 5, "high": 5}, "needs low < high"),
        ({"points": 1}, "points=1 is invalid"),
        ({"trajectory": "all"}, "trajectory='all' is invalid; valid: transcript, last_turn, answer"),
        ({"concurrency": 0}, "concurrency=0 is invalid"),
        ({"timeout_s": 0}, "timeout_s=0 is invalid"),
        ({"backend": "gpt"}, "backend='gpt' is invalid; valid: openai"),
        ({"base_url": ""}, "needs base_url and model"),
    ]:
        with pytest.raises(ConfigError, match=message):
            judge_reward([ep], **judge.options(**bad))
    assert judge.requests == []  # each refused before any call
    assert set(GROUP_PLACEHOLDERS) - set(PLACEHOLDERS) == {"trajectories", "count"}


# --- an endpoint judge that fails: env_error, never a 0 reward ---------------------------------------------


@pytest.mark.parametrize(
    "reply, options, why",
    [
        ("I think it is fine.", {}, "answered unparseably: no line 'SCORE: <a number from 0 to 10 (10 is best)>'"),
        ("SCORE: 11", {}, "answered unparseably: the verdict 11 is outside [0, 10]"),
        ("SCORE: maybe", {"scale": "yes_no"}, "answered unparseably: the verdict 'maybe' is not yes or no"),
        (500, {"retries": 1}, 'HTTP 500: \'{"error":{"message":"status 500"}}\' (tried 2 times)'),
        (400, {}, "HTTP 400"),
        (("slow", 3.0, "SCORE: 5"), {"timeout_s": 0.3}, "no answer within timeout_s=0.3"),
        ("SCORE: " + "9" * 400, {"scale": "likert"}, "answered unparseably: the verdict '99999"),
        ("SCORE: " + "9" * 400, {}, "answered unparseably: the verdict '99999"),
        (("not gzip", "SCORE: 5"), {}, "cannot reach it (DecodingError: "),
    ],
)
def test_a_judge_that_fails_ends_the_episode_as_env_error_naming_the_judge_and_why(judge, reply, options, why):
    right, score = {"yes_no": ("SCORE: yes", 1.0), "likert": ("SCORE: 4", 0.75)}.get(
        options.get("scale"), ("Right.\nSCORE: 8", 0.8)
    )
    judge.script = by_task(one=reply, two=right)
    bad, good = episode("task one", "41"), episode("task two", "42")
    started = time.monotonic()
    means = composed([bad, good], **judge.options(**options))
    assert time.monotonic() - started < 2.5  # a hang is cut at the timeout
    assert bad.end_reason == "env_error" and bad.error.startswith(
        f"reward 'judge': judge 'judge-model' at {judge.base_url}: {why}"
    )
    assert bad.rewards == {"judge": [0.0, 0.0], "total": [0.0, 0.0]} and bad.turns[-1].info["judge"]["error"]
    assert good.end_reason == "done" and good.rewards["judge"] == [0.0, score]
    assert means == {"judge": score, "total": score}  # the failed episode counts in no mean
    metrics = rollout_metrics([bad, good], 1.0, means)
    assert metrics["env_errors"] == 1.0 and metrics["reward"] == score
    assert KEY not in bad.error


def test_a_step_whose_judge_failed_every_episode_names_the_reward_not_the_env(judge):
    """It said "every episode failed in the env 'dataset'", and to run again once the env was back."""
    from omrl.training.rollout_health import RolloutHealth

    judge.script = lambda prompt: "no verdict here"
    episodes = [episode("Say 42.", "42"), episode("Say 42.", "41")]
    composed(episodes, **judge.options())
    health = RolloutHealth()
    health.add(2, 2, 2, 10, episodes[0].error)
    assert health.failed_in("dataset") == "the reward 'judge'"


@pytest.mark.parametrize("weights", [{"judge": 1.0, "goal": 1.0}, {"goal": 1.0, "judge": 1.0}])
def test_an_episode_the_judge_failed_counts_in_no_component_before_or_after_it(judge, weights):
    judge.script = by_task(one="garbage", two="SCORE: 2")
    bad, good = episode("task one", "42"), episode("task two", "42")
    bad.won = True  # the goal reward would give it 1.0
    means = compose_rewards([bad, good], weights, {"judge": judge.options()})
    assert bad.end_reason == "env_error" and bad.rewards == {
        "judge": [0.0, 0.0],
        "goal": [0.0, 0.0],
        "total": [0.0, 0.0],
    }
    assert good.rewards == {"judge": [0.0, 0.2], "goal": [0.0, 0.0], "total": [0.0, 0.2]}
    assert means == {"judge": 0.2, "goal": 0.0, "total": 0.2}


def test_a_busy_server_is_asked_again_and_then_scores(judge):
    answers = iter([503, "SCORE: 6"])
    judge.script = lambda prompt: next(answers)
    ep = episode("Say 42.", "42")
    assert judge_reward([ep], **judge.options(retries=1)) == [[0.0, 0.6]] and len(judge.requests) == 2


def test_a_refused_key_stops_the_run_naming_the_variable_not_the_key(judge):
    judge.script = lambda prompt: ("status", 401, f"Incorrect API key provided: {KEY}")  # as some servers echo it
    with pytest.raises(ConfigError, match=r"refused the API key \(HTTP 401.*check the key in \$JUDGE_KEY") as caught:
        judge_reward([episode("Say 42.", "42")], **judge.options())
    assert KEY not in str(caught.value) and "Incorrect API key provided: ***" in str(caught.value)


def test_a_judge_past_the_reward_deadline_is_left_behind_and_its_episodes_dropped(judge, tmp_path):
    from omrl.config.options import DeadlineConfig
    from omrl.supervisor import supervise

    judge.script = lambda prompt: ("slow", 5.0, "SCORE: 5")
    episodes = [episode("Say 42.", "42"), episode("Say 41.", "41")]
    started = time.monotonic()
    with supervise(DeadlineConfig(reward_s=0.5, grace_s=5.0, heartbeat_s=0.0), tmp_path, warn=lambda text: None):
        composed(episodes, **judge.options(timeout_s=30))
    assert time.monotonic() - started < 3.0  # not waiting for the calls still in flight
    assert all(ep.end_reason == "env_error" and "deadlines.reward_s=0.5" in ep.error for ep in episodes)


# --- concurrency and the cache ---------------------------------------------------------------------------


def test_calls_run_concurrently_up_to_the_bound(judge):
    judge.script = lambda prompt: ("slow", 0.3, "SCORE: 5")
    episodes = [episode(f"task {i}", "42") for i in range(6)]
    judge_reward(episodes, **judge.options(concurrency=3))
    assert judge.most_in_flight == 3 and len(judge.requests) == 6  # three at once, never more


def test_identical_prompts_are_judged_once_a_run(judge):
    judge.script = lambda prompt: "SCORE: 4"
    first = [episode("Say 42.", "42"), episode("Say 42.", "42"), episode("Say 42.", "7")]
    assert judge_reward(first, **judge.options()) == [[0.0, 0.4]] * 3
    assert len(judge.requests) == 2  # the two identical episodes: one prompt
    assert [ep.turns[-1].info["judge"]["cached"] for ep in first] == [False, True, False]
    again = [episode("Say 42.", "42")]
    assert judge_reward(again, **judge.options()) == [[0.0, 0.4]]
    assert len(judge.requests) == 2 and again[0].turns[-1].info["judge"]["cached"] is True
    judge_reward(again, **judge.options(cache=False))
    assert len(judge.requests) == 3


def test_an_unparseable_reply_is_not_cached(judge):
    answers = iter(["no idea", "SCORE: 3"])
    judge.script = lambda prompt: next(answers)
    first, second = episode("Say 42.", "42"), episode("Say 42.", "42")
    judge_reward([first], **judge.options())
    assert first.end_reason == "env_error"
    assert judge_reward([second], **judge.options()) == [[0.0, 0.3]] and len(judge.requests) == 2


# --- group-relative mode (RULER) -------------------------------------------------------------------------


def ranking(*scores, explanation="because"):
    entries = [{"id": i, "explanation": f"{explanation} {i}", "score": s} for i, s in enumerate(scores, 1)]
    return "Comparing them.\n```json\n" + json.dumps({"scores": entries}) + "\n```"


def test_group_mode_asks_once_per_group_and_gives_each_episode_its_score(judge):
    judge.script = by_task(a=ranking(9, 2, 5), b=ranking(1, 10, 10))
    episodes = [episode(f"task {t}", str(s), group=g, sample=s) for g, t in enumerate("ab") for s in range(3)]
    values = judge_reward(episodes, **judge.options(group=True, trajectory="answer"))
    assert values == [[0.0, x] for x in (0.9, 0.2, 0.5, 0.1, 1.0, 1.0)]
    assert len(judge.requests) == 2  # one call per group
    (prompt,) = [p for p in judge.prompts() if "# Task\ntask a" in p]  # the calls run concurrently: any order
    assert "comparing 3 attempts" in prompt
    assert "## Attempt 1\nFinal answer: 0\n\n## Attempt 2\nFinal answer: 1\n\n## Attempt 3\nFinal answer: 2" in prompt
    assert '"score": <a number from 0 to 10 (10 is best)>}' in prompt
    info = [ep.turns[-1].info["judge"] for ep in episodes]
    assert [(i["group"], i["attempt"], i["rank"], i["of"]) for i in info[:3]] == [
        (0, 1, 1, 3),
        (0, 2, 3, 3),
        (0, 3, 2, 3),
    ]
    assert [i["rank"] for i in info[3:]] == [3, 1, 1]  # ties share a rank
    assert info[1]["reasoning"] == "because 2" and info[1]["verdict"] == "2"


def test_a_group_ranking_that_does_not_fit_fails_its_whole_group(judge):
    judge.script = by_task(a=ranking(9, 2), b=ranking(3, 4, 5))  # group a has 3 attempts but 2 scores
    episodes = [episode(f"task {t}", str(s), group=g) for g, t in enumerate("ab") for s in range(3)]
    composed(episodes, **judge.options(group=True))
    assert [ep.end_reason for ep in episodes] == ["env_error"] * 3 + ["done"] * 3
    assert "answered unparseably: 'scores' has ids [1, 2] for attempts 1 to 3" in episodes[0].error
    assert [ep.rewards["judge"][-1] for ep in episodes[3:]] == [0.3, 0.4, 0.5]


# --- end to end: `omrl rollout` with reward.weights={judge: 1} ---------------------------------------------


def test_rollout_scores_episodes_with_the_judge_and_counts_its_failures(fake_plugins, judge, tmp_path, capsys):
    judge.script = lambda prompt: "no verdict here" if "chest 1." in prompt else "Fine.\nSCORE: 5"
    out = tmp_path / "judged.parquet"
    code, stdout, stderr = cli_exit(
        capsys,
        *keys_rollout(2, *FAST, "-o", str(out), "max_env_error_rate=0.6"),
        "reward.weights={judge: 1}",
        f"plugins.judge.base_url={judge.base_url}",
        "plugins.judge.model=judge-model",
        "plugins.judge.api_key_env=JUDGE_KEY",
        "plugins.judge.retries=0",
    )
    text = " ".join((stdout + stderr).split())
    assert code in (0, None), text
    scored, failed = read_episodes(out)
    assert scored.rewards["judge"][-1] == 0.5 and scored.turns[-1].info["judge"]["reasoning"] == "Fine."
    assert failed.end_reason == "env_error" and "judge 'judge-model' at" in failed.error
    assert "mean_reward │ 0.500" in text and "env_errors │ 1" in text  # the failed episode is in no mean
    assert "of task 1: reward 'judge': judge 'judge-model' at" in text and "answered unparseably" in text
    assert len(judge.requests) == 2 and all(r["authorization"] == f"Bearer {KEY}" for r in judge.requests)
    assert KEY not in out.read_bytes().decode("latin-1") and KEY not in out.with_suffix(".jsonl").read_text()


def test_a_judge_nothing_listens_at_stops_the_run_before_its_first_rollout(fake_plugins, tmp_path, capsys):
    """Every episode of a rollout, and of two replays, ended as env_error before the run stopped."""
    import socket

    with socket.socket() as free:  # a port nothing listens at once closed
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    out = tmp_path / "judged.parquet"
    code, stdout, stderr = cli_exit(
        capsys,
        *keys_rollout(2, *FAST, "-o", str(out)),
        "reward.weights={judge: 1}",
        f"plugins.judge.base_url=http://127.0.0.1:{port}/v1",
        "plugins.judge.model=judge-model",
    )
    said = " ".join((stdout + stderr).split())
    assert code == 2 and f"reward 'judge': cannot reach http://127.0.0.1:{port}/v1 (ConnectionRefusedError" in said
    assert "start the judge's server, or fix plugins.judge.base_url" in said and not out.exists()
