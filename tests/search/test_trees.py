"""Trees as data: paths are ordinary episodes in the same parquet, with node and parent ids; old files still read."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from omrl.data import Episode, Turn, read_episodes, write_episodes
from omrl.rollout import EnvPool, RolloutLimits
from omrl.search import SearchContext, run_strategy
from omrl.search.tree import chain_tree
from tests.fakes import ActionTemplate, ChestEnv, ScriptedBackend, by_call


def beam_tree(tokenizer):
    backend = ScriptedBackend(
        tokenizer,
        by_call(
            ["Action: open", "Action: smash", "Action: look"], ["Action: take key", "Action: look", "Action: smash"]
        ),
    )
    ctx = SearchContext(
        EnvPool(ChestEnv, name="chest"),
        ActionTemplate(),
        tokenizer,
        backend,
        RolloutLimits(max_new_tokens=12, max_turns=3),
        strategy="beam",
        plugin_options={"beam": {"width": 2, "branch": 3, "stop_on_win": False}},
    )
    (tree,) = run_strategy(ctx, [1])
    return tree


def test_tree_paths_round_trip_through_parquet_with_their_ids(tiny_tokenizer, tmp_path):
    tree = beam_tree(tiny_tokenizer)
    episodes = tree.episodes()
    assert len(episodes) == len(tree.leaves()) >= 4
    assert [ep.sample for ep in episodes] == list(range(len(episodes)))
    assert all(ep.group == 0 and ep.task_id == 1 for ep in episodes)
    back = read_episodes(write_episodes(episodes, tmp_path / "tree.parquet"))
    assert back == episodes
    ids = {(turn.node_id, turn.parent_id) for ep in back for turn in ep.turns}
    assert len({node for node, _ in ids}) == len(tree.nodes) - 1  # every node appears, once per id
    assert all(parent < node for node, parent in ids)
    assert sum(ep.turns[-1].info["search"].get("chosen", False) for ep in back) == 1


def test_files_without_node_ids_still_read(tmp_path):
    """An episode/2 file: turns have no node_id or parent_id; they read as -1."""
    ep = Episode(
        "gridworld",
        3,
        "train",
        "go",
        turns=[Turn("obs", "Act: up", "up", True, 0.0, True, span=(2, 4))],
        token_ids=[1, 2, 3, 4],
        loss_mask=[0, 0, 1, 1],
        logprobs=[0, 0, -1, -1],
    )
    write_episodes([ep], tmp_path / "new.parquet")
    table = pq.read_table(tmp_path / "new.parquet")
    turns = table.column("turns").to_pylist()
    old_turn_type = pa.struct(
        [field for field in table.schema.field("turns").type.value_type if field.name not in ("node_id", "parent_id")]
    )
    old_turns = pa.array(
        [[{k: v for k, v in t.items() if k not in ("node_id", "parent_id")} for t in row] for row in turns],
        type=pa.list_(old_turn_type),
    )
    old = table.set_column(table.schema.get_field_index("turns"), "turns", old_turns)
    old = old.replace_schema_metadata({b"omrl.schema": b"episode/2"})
    pq.write_table(old, tmp_path / "old.parquet")
    (back,) = read_episodes(tmp_path / "old.parquet")
    assert back.turns[0].node_id == -1 and back.turns[0].parent_id == -1
    assert back.turns[0].action == "up" and back.turns[0].span == (2, 4)


def test_chains_become_a_tree_whose_leaves_are_the_played_episodes(tiny_tokenizer):
    from omrl.rollout import collect

    backend = ScriptedBackend(tiny_tokenizer, by_call(["Action: open", "Action: smash"], ["Action: take key"]))
    played = collect(
        EnvPool(ChestEnv, name="chest"), ActionTemplate(), tiny_tokenizer, [0], backend=backend, group_size=2
    )
    tree = chain_tree(played, 0, 0)
    assert [leaf.episode for leaf in tree.leaves()] == played  # the very episodes, unchanged
    opened = tree.root.children[0]
    assert opened.episode.token_ids == played[0].token_ids[: played[0].turns[1].span[0]]
    paths = tree.episodes()
    assert [ep.token_ids for ep in paths] == [ep.token_ids for ep in played]
    assert [[t.node_id for t in ep.turns] for ep in paths] == [[1, 2], [3]]
    # a tree kept as played (the batched rollout's, as chain plays it without a budget) gives them unchanged
    assert chain_tree(played, 0, 0, as_played=True).episodes() == played
