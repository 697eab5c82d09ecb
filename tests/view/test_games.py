"""Games of several seats in the viewer: played by omrl.rollout.seats (TextArena's TicTacToe), written to a
trajectory parquet, and shown as whole games: every seat's moves in play order, labelled by seat and player,
with each seat's outcome; the list filters by seat and outcome. One-agent episodes stay as they were."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("textarena")

from omrl import registry  # noqa: E402
from omrl.backends.hf import HFBackend  # noqa: E402
from omrl.data.trajectory import write_episodes  # noqa: E402
from omrl.rollout import EnvPool, RolloutLimits  # noqa: E402
from omrl.rollout.seating import POLICY, SCRIPTED  # noqa: E402
from omrl.rollout.seats import play_seats  # noqa: E402
from omrl.view import open_run  # noqa: E402
from omrl.view.page import write_page  # noqa: E402
from omrl_plugins.envs.engines.textarena_duel import TextArenaDuelEnv  # noqa: E402
from tests.fakes import ScriptedBackend, by_call  # noqa: E402

from .conftest import small_episodes  # noqa: E402

# player_0 takes the top row while player_1 plays 3 and 4: five moves, player_0 wins
TOP_ROW = by_call(*[[f"Think: go.\nAct: [{cell}]"] for cell in (0, 3, 1, 4, 2)])


def tictactoe(backend, tokenizer, seating, tasks=(0,), group_size=1, max_new_tokens=8):
    pool = EnvPool(TextArenaDuelEnv, {"game": "TicTacToe-v0"}, name="textarena-duel:TicTacToe-v0")
    try:
        return play_seats(
            pool,
            registry.templates.get("react")(),
            tokenizer,
            list(tasks),
            seating=seating,
            backend=backend,
            limits=RolloutLimits(max_new_tokens=max_new_tokens, max_context=2048),
            group_size=group_size,
            seed=1,
        )
    finally:
        pool.close()


@pytest.fixture(scope="module")
def tiny_games(tiny_hf, tmp_path_factory):
    """The tiny model against the scripted player, and in self-play: a parquet of each."""
    model, tokenizer = tiny_hf
    backend = HFBackend(model, tokenizer, batch_size=16)
    folder = tmp_path_factory.mktemp("games")
    scripted = tictactoe(backend, tokenizer, {"player_0": SCRIPTED, "player_1": POLICY}, tasks=(0, 1))
    self_play = tictactoe(backend, tokenizer, {"player_0": POLICY, "player_1": POLICY})
    write_episodes(scripted + self_play, folder / "games.parquet", tokenizer)
    return folder / "games.parquet", scripted, self_play


def test_a_whole_game_in_play_order_from_both_seats_episodes(tiny_tokenizer, tmp_path):
    """Self-play where both seats move: each seat's turns sit among the other's, in the order played."""
    backend = ScriptedBackend(tiny_tokenizer, TOP_ROW)
    episodes = tictactoe(backend, tiny_tokenizer, {"player_0": POLICY, "player_1": POLICY}, max_new_tokens=32)
    assert [ep.info["outcome"] for ep in episodes] == ["win", "loss"]
    assert episodes[0].info["moves"] == [["player_0", "[0]"], ["player_1", "[3]"], ["player_0", "[1]"],
                                         ["player_1", "[4]"], ["player_0", "[2]"]]  # fmt: skip
    store = open_run(write_episodes(episodes, tmp_path / "self.parquet"), tokenizer="tiny")
    first = store.episode(0)
    game = first["game"]
    assert game == store.episode(1)["game"] and game["order"] == "recorded"
    assert [(s["seat"], s["player"], s["outcome"], s["reward"], s["episode"]) for s in game["seats"]] == [
        ("player_0", "policy", "win", 1.0, 0),
        ("player_1", "policy", "loss", -1.0, 1),
    ]
    assert [(m["seat"], m["episode"], m["turn"], m["action"]) for m in game["moves"]] == [
        ("player_0", 0, 0, "[0]"),
        ("player_1", 1, 0, "[3]"),
        ("player_0", 0, 1, "[1]"),
        ("player_1", 1, 1, "[4]"),
        ("player_0", 0, 2, "[2]"),
    ]
    # each move carries what its seat saw: player_1's second move saw player_0's second
    assert "placed their symbol (O) in cell 1" in game["moves"][3]["observation"]
    assert game["moves"][4]["response"] == "Think: go.\nAct: [2]"


def test_summaries_and_filters_by_seat_and_outcome(tiny_games):
    path, scripted, self_play = tiny_games
    store = open_run(path)
    facets = store.overview()["facets"]
    assert facets["seat"] == ["player_0", "player_1"] and facets["outcome"] == ["win", "loss"]
    # the seat the policy played against the scripted one, and self-play's player_1, who never moved
    assert store.query({"seat": "player_1"})["total"] == 3
    assert store.query({"seat": "player_0", "outcome": "loss"})["total"] == 1  # self-play: player_0 forfeits
    assert store.query({"outcome": "win"})["total"] == 1  # ... so player_1 won without a move
    row = store.query({"seat": "player_1", "outcome": "loss"})["items"][0]
    assert (row["player"], row["opponent"], row["outcome"]) == ("policy", "scripted", "loss")
    # the scripted seat's moves are in the game, though it has no episode
    game = store.episode(row["id"])["game"]
    assert [(s["seat"], s["player"], s["outcome"], s["episode"]) for s in game["seats"]] == [
        ("player_0", "scripted", "win", None),
        ("player_1", "policy", "loss", row["id"]),
    ]
    assert [(m["seat"], m.get("episode"), m["invalid"] if "invalid" in m else None) for m in game["moves"]] == [
        ("player_0", None, None),
        ("player_1", row["id"], True),
        ("player_1", row["id"], True),
    ]
    assert game["moves"][0]["action"] == scripted[0].info["moves"][0][1] == "[4]"


def test_one_agent_episodes_are_shown_as_before(small_run):
    store = open_run(small_run)
    assert all("seat" not in e and "game" not in e for e in store.summaries)
    assert "game" not in store.episode(0)
    assert store.overview()["facets"]["seat"] == [] and store.overview()["facets"]["outcome"] == []
    assert store.query({"seat": "player_0"})["total"] == 0  # a seat filter matches no one-agent episode
    assert len(small_episodes()) == store.query({})["total"]


def test_a_file_without_the_move_log_shows_the_turns_it_has(tiny_games, tmp_path):
    _, _, self_play = tiny_games
    for ep in self_play:
        ep.info = {k: v for k, v in ep.info.items() if k != "moves"}  # as the rollout wrote it before the log
    store = open_run(write_episodes(self_play, tmp_path / "old.parquet"))
    game = store.episode(0)["game"]
    assert game["order"] == "assumed" and [m["seat"] for m in game["moves"]] == ["player_0", "player_0"]
    assert json.dumps(game)  # JSON-ready


@pytest.mark.slow  # a browser
def test_the_page_shows_every_seats_moves_and_outcomes(tiny_games, chromium, tmp_path):
    from .test_browser import page_of, serving

    path, _, _ = tiny_games
    store = open_run(path)
    scripted_game = store.query({"seat": "player_1", "outcome": "loss"})["items"][0]["id"]
    saved, _ = write_page(store, tmp_path / "games.html")
    with serving(path) as url, page_of(chromium) as page:
        for base in (url, saved.as_uri()):
            page.goto(base + "#/episodes")
            page.wait_for_selector("table.list tbody tr")
            headers = page.locator("table.list thead th").all_inner_texts()
            assert {"seat", "played by", "outcome"} <= set(headers)
            page.select_option("select[name=seat]", "player_1")
            page.wait_for_selector("text=3 of 4 episodes match")
            page.select_option("select[name=outcome]", "loss")
            page.wait_for_selector("text=2 of 4 episodes match")
            page.goto(base + f"#/episode/{scripted_game}")
            page.wait_for_selector(".game .move")
            seats = page.locator(".game-seats tbody tr")
            assert seats.all_inner_texts()[0].split("\t")[:3] == ["player_0", "scripted", "win"]
            assert seats.all_inner_texts()[1].split("\t")[:3] == ["player_1", "policy", "loss"]
            # the env's reward per seat, told apart from the run's reward of an episode (they differ: goal gives a loss 0)
            assert "game reward" in page.locator(".game-seats thead").inner_text()
            assert "the run's reward.weights applied to its turns" in page.inner_text(".game")
            moves = page.locator(".game .move")
            assert moves.count() == 3
            assert [moves.nth(i).get_attribute("data-seat") for i in range(3)] == ["player_0", "player_1", "player_1"]
            assert "scripted" in moves.nth(0).inner_text() and "[4]" in moves.nth(0).inner_text()
            assert "policy" in moves.nth(1).inner_text() and "invalid move" in moves.nth(1).inner_text()
            assert "placed their symbol (O) in cell 4" in moves.nth(1).locator("pre.observation").inner_text()
            assert page.locator(".move.this").count() == 2  # this episode's own moves, marked
            assert "player_1 (played by policy)" in page.inner_text("tr[data-fact=seat]")
            assert "loss against scripted" in page.inner_text("tr[data-fact=outcome]")
