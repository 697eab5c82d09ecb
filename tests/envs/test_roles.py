"""``solve-verify`` (plugins/envs/roles.py): a dataset's tasks played by two roles, a solver and a verifier,
with a reward per role; played by the env's own players, stepped by hand, and by the real `tiny` model in
both roles through play_seats."""

from __future__ import annotations

import json

import pytest

from omrl import registry
from omrl.backends.hf import HFBackend
from omrl.config import command_line_config
from omrl.config.options import RolloutRunConfig
from omrl.envs import check_seats, create_env, seat_reset_problem, seat_step_problem
from omrl.errors import ConfigError
from omrl.rollout import EnvPool, PlaySpec, RolloutLimits, RolloutSession
from omrl.rollout.seating import POLICY, SCRIPTED
from omrl.rollout.seats import play_seats
from omrl_plugins.envs import roles
from omrl_plugins.envs.roles import SolveVerifyEnv

ROWS = [
    {"question": "What is 2 + 3?", "answer": "5"},
    {"question": "What is 7 * 6?", "answer": 42},
    {"question": "Capital of France?", "answer": ["Paris", "paris, france"]},
]


@pytest.fixture(scope="module")
def tasks_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("roles") / "qa.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    return str(path)


@pytest.fixture
def roles_registered(register_plugin):
    """The plugin under its entry-point name, unless the installed package registers it already."""
    if "solve-verify" not in registry.envs.names():
        register_plugin(roles, name="omrl.envs.roles")


def play(env: SolveVerifyEnv, task: int, moves: list[str]) -> tuple[list, dict[str, list[str]], dict[str, float]]:
    """Step ``moves`` (a move is None: the env's own player for the seat to move) until the game ends;
    (each move as (seat, action, info), each seat's views, the seat rewards)."""
    first = env.reset(task)
    assert seat_reset_problem(first, env.seats) is None
    views = {seat: [text] for seat, text in first.views.items()}
    seat, played, queued = first.seat, [], list(moves)
    while True:
        action = queued.pop(0) if queued else None
        action = env.scripted_action(seat) if action is None else action
        result = env.step(action)
        assert seat_step_problem(result, env.seats) is None
        played.append((seat, action, result.info))
        for name, text in result.views.items():
            views[name].append(text)
        if result.done:
            assert not queued, f"the game ended with moves left: {queued}"
            return played, views, result.seat_rewards
        seat = result.seat


def test_the_env_registers_with_two_roles(roles_registered, tasks_file):
    env_class = registry.envs.get("solve-verify")
    assert env_class is SolveVerifyEnv and check_seats(env_class, "solve-verify") == ("solver", "verifier")
    env = create_env(env_class, {"path": tasks_file, "rounds": 2}, "solve-verify")
    assert list(env.task_ids("train")) == [0, 1, 2] and env.max_turns == 6


def test_the_scripted_players_play_both_roles(tasks_file):
    right = SolveVerifyEnv(tasks_file)
    for task in range(3):
        played, _, rewards = play(right, task, [])
        assert [(seat, info.get("verdict")) for seat, _, info in played] == [("solver", None), ("verifier", "accept")]
        assert rewards == {"solver": 1.0, "verifier": 1.0}
    # a solver that is always wrong: rejected, revised (still wrong), rejected again
    wrong = SolveVerifyEnv(tasks_file, rounds=1, solver_accuracy=0.0)
    played, views, rewards = play(wrong, 1, [])
    assert [action for _, action, _ in played] == [
        "43",
        "reject: the answer does not match the reference answer",
        "43",
        "reject: the answer does not match the reference answer",
    ]
    assert rewards == {"solver": -1.0, "verifier": 1.0}
    assert "rejected your answer 43: the answer does not match" in views["solver"][1]
    assert "revision 1 of 1" in views["solver"][1]
    # the scripted solver's choice is a function of the task alone
    assert play(SolveVerifyEnv(tasks_file, solver_accuracy=0.5), 2, []) == play(
        SolveVerifyEnv(tasks_file, solver_accuracy=0.5), 2, []
    )


@pytest.mark.parametrize(
    "rounds, moves, expected",
    [
        (0, ["5", "accept"], {"solver": 1.0, "verifier": 1.0}),  # a correct answer accepted
        (0, ["5", "reject: too easy"], {"solver": 1.0, "verifier": -1.0}),  # a correct answer rejected
        (0, ["6", "accept"], {"solver": -1.0, "verifier": -1.0}),  # a wrong answer accepted
        (0, ["6", "Reject: 2 + 3 is 5"], {"solver": -1.0, "verifier": 1.0}),  # a wrong answer rejected
        (1, ["6", "reject[2 + 3 is 5]", "answer[5]", "accept"], {"solver": 1.0, "verifier": 1.0}),  # revised
        (1, ["5", "reject", "6", "accept"], {"solver": -1.0, "verifier": -1.0}),  # talked out of it
        (1, ["5", "reject", "5", "accept"], {"solver": 1.0, "verifier": 0.0}),  # one right verdict of two
        (3, ["6", "maybe?"], {"solver": -1.0, "verifier": -1.0}),  # no verdict: wrong, and the game ends
        (3, ["", ""], {"solver": -1.0, "verifier": -1.0}),  # replies that did not parse, in both roles
        (0, ["", "reject: no answer"], {"solver": -1.0, "verifier": 1.0}),  # no answer, rightly rejected
    ],
)
def test_rewards_per_role(tasks_file, rounds, moves, expected):
    _, _, rewards = play(SolveVerifyEnv(tasks_file, rounds=rounds), 0, moves)
    assert rewards == expected


def test_each_role_sees_its_own_view(tasks_file):
    env = SolveVerifyEnv(tasks_file, rounds=1, instruction="Answer with a number.")
    first = env.reset(1)
    assert first.instruction == "Answer with a number.\n\nWhat is 7 * 6?"  # the task: every role is told it
    assert first.seat == "solver" and first.text == first.views["solver"]
    assert "You are the solver" in first.views["solver"] and "up to 1 time(s)" in first.views["solver"]
    assert "You are the verifier" in first.views["verifier"]
    proposed = env.step("41")
    assert proposed.seat == "verifier" and set(proposed.views) == {"verifier"}  # the solver sees nothing yet
    assert "The solver proposes: 41" in proposed.views["verifier"]
    assert proposed.info["ground_truth"] == "42" and proposed.info["correct"] is False
    rejected = env.step("reject: 7 * 6 is 42")
    assert rejected.seat == "solver" and set(rejected.views) == {"solver"}
    assert rejected.info["verdict"] == "reject" and "rejected your answer 41: 7 * 6 is 42" in rejected.observation
    revised = env.step("42")
    assert revised.info["correct"] and "The solver proposes: 42" in revised.views["verifier"]
    end = env.step("accept")
    assert end.done and end.seat_rewards == {"solver": 1.0, "verifier": 1.0}  # both verdicts right
    assert "accepted the answer 42, which is correct" in end.views["solver"] == end.views["verifier"]
    assert env.scripted_action("solver") is None
    with pytest.raises(Exception, match="no episode in progress"):
        env.step("42")


def test_a_list_of_accepted_answers_and_the_expert(tasks_file):
    env = SolveVerifyEnv(tasks_file, solver_accuracy=0.0)
    env.reset(2)
    assert env.expert_action() == "Paris" and env.scripted_action("solver") == "not Paris"
    assert env.scripted_action("verifier") is None  # not its turn
    result = env.step("paris, france")
    assert result.info["ground_truth"] == ["Paris", "paris, france"] and result.info["correct"]
    assert env.expert_action() == "accept"


def test_bad_options_are_refused_naming_what_is_valid(tasks_file):
    with pytest.raises(ConfigError, match="needs plugins.solve-verify.path=FILE"):
        SolveVerifyEnv()
    with pytest.raises(ConfigError, match=r"rounds=-1 is invalid; valid: an integer in 0\.\.10"):
        SolveVerifyEnv(tasks_file, rounds=-1)
    with pytest.raises(ConfigError, match=r"rounds='2' is invalid"):
        SolveVerifyEnv(tasks_file, rounds="2")
    with pytest.raises(ConfigError, match=r"solver_accuracy=1.5 is invalid; valid: a number in \[0, 1\]"):
        SolveVerifyEnv(tasks_file, solver_accuracy=1.5)
    with pytest.raises(ConfigError, match=r"solver_accuracy=True is invalid"):
        SolveVerifyEnv(tasks_file, solver_accuracy=True)
    with pytest.raises(ConfigError, match="match='fuzzy' is invalid; valid: exact, numeric, math"):
        SolveVerifyEnv(tasks_file, match="fuzzy")  # the dataset env's own check
    with pytest.raises(ConfigError, match="no such file"):
        SolveVerifyEnv(tasks_file + ".missing")
    with pytest.raises(ConfigError, match="does not take options .*max_attempts.* its options: path"):
        create_env(SolveVerifyEnv, {"path": tasks_file, "max_attempts": 2}, "solve-verify")
    with pytest.raises(Exception, match="unknown task id 7"):
        SolveVerifyEnv(tasks_file).reset(7)


# -- the policy in both roles, with the real tiny model --------------------------------------------------


@pytest.fixture(scope="module")
def policy(tiny_hf):
    model, tokenizer = tiny_hf
    return HFBackend(model, tokenizer, batch_size=16), tokenizer


def play_policy(policy, tasks_file, seating, *, tasks=(0, 1), group_size=2):
    backend, tokenizer = policy
    pool = EnvPool(SolveVerifyEnv, {"path": tasks_file, "rounds": 1}, name="solve-verify")
    template = registry.templates.get("react")()
    try:
        return play_seats(
            pool,
            template,
            tokenizer,
            list(tasks),
            seating=seating,
            backend=backend,
            limits=RolloutLimits(max_new_tokens=8, max_context=2048),
            group_size=group_size,
            seed=5,
        )
    finally:
        pool.close()


def test_the_policy_plays_both_roles_each_credited_and_grouped_by_task_and_role(policy, tasks_file):
    episodes = play_policy(policy, tasks_file, {"solver": POLICY, "verifier": POLICY})
    assert len(episodes) == 8  # 2 tasks x 2 games x 2 roles
    groups: dict[int, list] = {}
    for ep in episodes:
        groups.setdefault(ep.group, []).append(ep)
    assert sorted(groups) == [0, 1, 2, 3]  # task index * 2 + role index
    for group, members in groups.items():
        assert {ep.task_id for ep in members} == {group // 2}
        assert {ep.info["seat"] for ep in members} == {("solver", "verifier")[group % 2]}
        assert sorted(ep.sample for ep in members) == [0, 1]
    for ep in episodes:
        # each role trains on exactly its own sampled tokens; the other role's text is context
        trained = [t for t, m in zip(ep.token_ids, ep.loss_mask) if m]
        assert trained == [t for turn in ep.turns for t in ep.token_ids[slice(*turn.span)]] != []
        assert sum(ep.loss_mask) == sum(turn.info["rollout"]["new_tokens"] for turn in ep.turns)
        chat = "\n".join(m["content"] for m in ep.messages)
        me, other = ep.info["seat"], {"solver": "verifier", "verifier": "solver"}[ep.info["seat"]]
        assert f"You are the {me}" in chat and f"You are the {other}" not in chat
        assert ROWS[ep.task_id]["question"] in ep.messages[1]["content"]
        # tiny's replies never parse: no answer (wrong), and no verdict (a wrong judgement)
        assert ep.info["seat_rewards"] == {"solver": -1.0, "verifier": -1.0}
        assert ep.info["seat_reward"] == -1.0 and ep.turns[-1].reward == -1.0 and ep.info["outcome"] == "loss"
    by_game: dict[int, set] = {}
    for ep in episodes:
        by_game.setdefault(ep.info["game"], set()).add(ep.info["seat"])
    assert all(seats == {"solver", "verifier"} for seats in by_game.values()) and len(by_game) == 4
    verifier = next(ep for ep in episodes if ep.info["seat"] == "verifier")
    assert "The solver proposed no answer." in verifier.messages[1]["content"]


def test_the_policy_verifies_the_scripted_solver(policy, tasks_file):
    episodes = play_policy(policy, tasks_file, {"solver": SCRIPTED, "verifier": POLICY}, tasks=(1,), group_size=1)
    (ep,) = episodes
    assert ep.info["seat"] == "verifier" and ep.info["opponent"] == "scripted"
    assert "The solver proposes: 42" in ep.messages[1]["content"]  # the reference answer, shown as context
    assert ep.info["seat_rewards"] == {"solver": 1.0, "verifier": -1.0}  # no verdict parsed: a wrong judgement


def test_the_expert_plays_the_right_moves_whatever_the_scripted_solver_gets_wrong(roles_registered, tasks_file):
    """solver_accuracy=0: the env's own solver always errs; the expert (its expert_action) never does,
    so expert SFT data teaches right answers."""
    cfg = command_line_config(
        RolloutRunConfig,
        [
            "env.name=solve-verify",
            f"plugins.solve-verify.path={tasks_file}",
            "plugins.solve-verify.solver_accuracy=0",
            "model.name=tiny",
            "env.template=react",
        ],
        {},
    )
    with RolloutSession.from_config(cfg, expert=True) as session:
        episodes = session.play([0, 1, 2], PlaySpec(expert=True)).episodes
    solved = {ep.task_id: [turn.action for turn in ep.turns] for ep in episodes if ep.info["seat"] == "solver"}
    assert solved == {0: ["5"], 1: ["42"], 2: ["Paris"]}
    assert all(ep.won for ep in episodes if ep.info["seat"] == "solver")
