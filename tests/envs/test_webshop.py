"""The built-in webshop env: catalog, search, pages, WebShop's reward, the expert and WebShop's own files."""

from __future__ import annotations

import gzip
import json
import re
import runpy
import time
from pathlib import Path

import pytest

from omrl.envs import EpisodeFinishedError, UnknownTaskError, create_env
from omrl.errors import ConfigError
from omrl_plugins.envs.webshop import WebShopEnv
from omrl_plugins.envs.webshop.catalog import BUILTIN_DATA, Goal, Product
from omrl_plugins.envs.webshop.expert import search_keywords
from omrl_plugins.envs.webshop.reward import webshop_reward

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def env() -> WebShopEnv:
    return WebShopEnv()


def goal_with_paging(env: WebShopEnv) -> int:
    """A test task whose search fills all five result pages."""
    return next(
        t
        for t in env.task_ids("test")
        if len(env.shop.index.search(search_keywords(env.catalog.goals[t].instruction))) == 50
    )


def play_expert(env: WebShopEnv, task_id: int):
    env.reset(task_id)
    for _ in range(env.max_turns):
        action = env.expert_action()
        if action.startswith("click["):
            assert action in env.admissible_actions(), f"expert clicked something the page does not show: {action}"
        result = env.step(action)
        if result.done:
            return result
    return result


# catalog and splits


def test_catalog_has_enough_products_categories_and_goals(env):
    catalog = env.catalog
    assert len(catalog.products) >= 1000
    assert len({p.category for p in catalog.products}) >= 10
    assert len(catalog.goals) >= 500
    for product in catalog.products[:50]:
        assert product.options and product.bullet_points and product.description and product.reviews
        assert product.title and product.price > 0 and product.price_tag.startswith("$")
    for goal in catalog.goals:
        target = catalog.by_asin[goal.asin]
        assert goal.attributes and set(goal.attributes) <= set(target.attributes)
        assert all(any(o in values for values in target.options.values()) for o in goal.options)
        assert goal.instruction.endswith(f"price lower than {goal.price_upper:.2f} dollars")
        assert target.price < goal.price_upper <= target.price + 40


def test_train_and_test_are_disjoint_and_cover_the_goals(env):
    train, test = set(env.task_ids("train")), set(env.task_ids("test"))
    assert len(train) == 800 and len(test) == 200
    assert not train & test
    assert train | test == set(range(len(env.catalog.goals)))
    with pytest.raises(UnknownTaskError, match="valid: train, test"):
        env.task_ids("dev")
    with pytest.raises(UnknownTaskError, match=r"valid: 0\.\.999"):
        env.reset(1000)


def test_shipped_catalog_is_the_generators_output():
    builder = runpy.run_path(str(REPO / "scripts" / "build_webshop_data.py"), run_name="build_webshop_data")
    assert builder["encode"](builder["build_payload"]()) == BUILTIN_DATA.read_bytes()
    assert BUILTIN_DATA.stat().st_size < 400_000


def test_instances_share_one_catalog_and_start_fast(env):
    assert WebShopEnv().shop is env.shop
    start = time.perf_counter()
    for task_id in range(200):
        WebShopEnv().reset(task_id)
    assert time.perf_counter() - start < 1.0  # 5 ms each; measured about 0.1 ms


# search and pages


def test_search_finds_the_goal_product(env):
    for task_id in env.task_ids("test")[:40]:
        goal = env.catalog.goals[task_id]
        assert goal.asin in env.shop.index.search(search_keywords(goal.instruction))
    first = env.reset(0)
    assert first.instruction == env.catalog.goals[0].instruction
    assert first.text == f"WebShop [SEP] Instruction: [SEP] {first.instruction} [SEP] Search"
    assert env.admissible_actions() == ["search[<query>]"]
    result = env.step("search[running shoes]")
    total = len(env.state.results)
    assert 20 <= total <= 50  # every running shoe, and other shoes made for running
    assert result.observation.startswith(f"Back to Search [SEP] Page 1 (Total results: {total}) [SEP] Next > [SEP] ")
    shown = env.state.page_asins
    assert len(shown) == 10
    assert all(env.catalog.by_asin[a].query == "running shoes" for a in shown)
    assert f"{shown[0]} [SEP] {env.catalog.by_asin[shown[0]].title} [SEP] $" in result.observation


def test_search_returns_the_top_50(env):
    env.reset(0)
    env.step("search[black]")
    assert len(env.state.results) == 50
    assert env.page.text.startswith("Back to Search [SEP] Page 1 (Total results: 50) [SEP] Next > [SEP] ")


def test_search_without_hits_shows_an_empty_results_page(env):
    env.reset(0)
    result = env.step("search[zzxq qqzzx]")
    assert result.observation == "Back to Search [SEP] Page 1 (Total results: 0)"
    assert env.admissible_actions() == ["click[back to search]"]


def test_paging_through_results(env):
    task_id = goal_with_paging(env)
    env.reset(task_id)
    env.step(f"search[{search_keywords(env.goal.instruction)}]")
    page1 = env.state.page_asins
    page2 = env.step("click[next >]").observation
    assert page2.startswith("Back to Search [SEP] Page 2 (Total results: 50) [SEP] < Prev [SEP] Next > [SEP] ")
    assert env.state.page_asins[0] in page2 and not set(page1) & set(env.state.page_asins)
    for _ in range(3):
        env.step("click[next >]")
    assert env.state.page == 5 and "click[next >]" not in env.admissible_actions()
    assert env.step("click[next >]").info["invalid"]
    env.step("click[< prev]")
    assert env.state.page == 4
    env.step("click[back to search]")
    assert env.state.kind == "search" and env.page.has_search_bar


def test_item_page_shows_options_price_and_sub_pages(env):
    env.reset(0)
    env.step("search[men's t-shirt]")
    asin = env.state.page_asins[2]
    product = env.catalog.by_asin[asin]
    text = env.step(f"click[{asin.lower()}]").observation  # ASINs click case-insensitively
    group, values = next(iter(product.options.items()))
    assert text.startswith(f"Back to Search [SEP] < Prev [SEP] {group} [SEP] {values[0]}")
    assert text.endswith(
        f"{product.title} [SEP] Price: {product.price_tag} [SEP] Rating: N.A. "
        "[SEP] Description [SEP] Features [SEP] Reviews [SEP] Buy Now"
    )
    assert f"click[{values[-1]}]" in env.admissible_actions()
    env.step(f"click[{values[-1]}]")
    assert env.state.chosen == {group: values[-1]}
    features = env.step("click[features]").observation
    assert features == " [SEP] ".join(["Back to Search", "< Prev", *product.bullet_points])
    assert env.step("click[< prev]").observation == text
    assert env.state.chosen == {group: values[-1]}  # options survive a visit to a sub-page
    assert product.description in env.step("click[description]").observation
    env.step("click[< prev]")
    assert product.reviews[0].body in env.step("click[reviews]").observation
    env.step("click[< prev]")
    env.step("click[< prev]")
    assert env.state.kind == "results" and env.state.page_asins[2] == asin


@pytest.mark.parametrize(
    "page, action, reason",
    [
        ("search", "buy now", "could not read"),
        ("search", "click[buy now]", "nothing is clickable here"),
        ("search", "search[]", "needs keywords"),
        ("search", "jump[home]", "unknown action 'jump'"),
        ("results", "search[red shoes]", "no search bar"),
        ("results", "click[B000000000]", "not clickable on this page"),
        ("item", "click[next >]", "clickables here: "),
        ("item", "click[nonexistent colour]", "not clickable"),
    ],
)
def test_invalid_actions_explain_and_change_nothing(env, page, action, reason):
    env.reset(3)
    if page != "search":
        env.step("search[water bottle]")
    if page == "item":
        env.step(f"click[{env.state.page_asins[0]}]")
    state, text = env.state, env.page.text
    result = env.step(action)
    assert result.info == {"won": False, "score": 0.0, "invalid": True}
    assert result.reward == 0.0 and not result.done
    assert reason in result.observation and result.observation.endswith(text)
    assert env.state == state


# reward


def product(**changes) -> Product:
    fields = dict(
        asin="B000000001",
        title="Acme Gluten Free Smoked Vegetarian Bacon Strips",
        category="grocery",
        query="bacon",
        product_category="Grocery & Gourmet Food › Meat Substitutes › Bacon",
        price=25.0,
        price_tag="$25.0",
        options={"size": ("4 ounce (pack of 1)", "4 ounce (pack of 2)"), "color": ("navy blue",)},
        bullet_points=("Crisps up in minutes",),
        description="Smoky taste without the meat.",
        reviews=(),
        rating="N.A.",
        attributes=("gluten free", "vegetarian"),
    )
    return Product(**{**fields, **changes})


GOAL = Goal(
    asin="B000000001",
    instruction="i need gluten free vegetarian bacon",
    attributes=("gluten free", "vegetarian"),
    options=("4 ounce (pack of 2)",),
    price_upper=40.0,
    query="bacon",
    product_category="Grocery & Gourmet Food › Meat Substitutes › Bacon",
    name="Acme Gluten Free Smoked Vegetarian Bacon Strips",
)


def test_reward_is_one_when_everything_matches():
    info = webshop_reward(product(), GOAL, 25.0, {"size": "4 ounce (pack of 2)"})
    assert info.reward == 1.0 and info.r_type == 1.0 and info.r_att == 1.0 and info.r_option == 1.0


def test_reward_loses_the_share_of_a_missing_attribute_option_or_price():
    no_vegetarian = product(title="Acme Smoked Bacon Strips", attributes=("gluten free",))
    assert webshop_reward(no_vegetarian, GOAL, 25.0, {"size": "4 ounce (pack of 2)"}).reward == pytest.approx(3 / 4)
    assert webshop_reward(product(), GOAL, 25.0, {"size": "12 ounce"}).reward == pytest.approx(3 / 4)
    assert webshop_reward(product(), GOAL, 41.0, {"size": "4 ounce (pack of 2)"}).reward == pytest.approx(3 / 4)
    assert webshop_reward(product(), GOAL, 41.0, {}).reward == pytest.approx(2 / 4)
    # an attribute found only in the description still counts
    described = product(attributes=("gluten free",), title="Acme Bacon Strips", description="A vegetarian favourite.")
    assert webshop_reward(described, GOAL, 25.0, {"size": "4 ounce (pack of 2)"}).reward == 1.0


def test_an_option_matches_as_in_webshop_goal_py_a_chosen_value_like_the_goal_s_and_nothing_else():
    """A wrong colour whose name is in the product's text ("blue" in "bluetooth") scored as a match, a win."""
    goal = Goal(**{**GOAL.__dict__, "options": ("grey",)})
    speaker = product(title="Acme Bluetooth Speaker", options={"color": ("blue", "grey")})
    assert webshop_reward(speaker, goal, 25.0, {"color": "blue"}).r_option == 0.0
    assert webshop_reward(speaker, goal, 25.0, {"color": "grey"}).r_option == 1.0
    # each goal option counts once, whatever the groups' names; WebShop's fuzzy rule holds for sizes too
    two = Goal(**{**GOAL.__dict__, "options": ("grey", "4 ounce (pack of 2)")})
    assert webshop_reward(speaker, two, 25.0, {"color": "grey", "style": "grey"}).r_option == 0.5
    assert webshop_reward(product(), GOAL, 25.0, {"size": "4 ounce (pack of 1)"}).r_option == 1.0


def test_reward_matches_colour_options_after_normalising():
    goal = Goal(**{**GOAL.__dict__, "options": ("navy",)})
    assert webshop_reward(product(), goal, 25.0, {"color": "navy blue"}).r_option == 1.0


def test_wrong_type_scales_the_reward():
    other_type = dict(query="ground coffee", product_category="Grocery & Gourmet Food › Beverages › Coffee")
    # 2 of the goal title's 7 content words shared (0.29 > 0.2): the type still counts as right
    assert (
        webshop_reward(product(title="Acme Bacon Flavored Ground Coffee", **other_type), GOAL, 25.0, {}).r_type == 1.0
    )
    # 1 of 7 (0.14): r_type 0.5; below 0.1: 0.1; none: 0
    half = webshop_reward(
        product(title="Acme Ground Coffee", **other_type), GOAL, 25.0, {"size": "4 ounce (pack of 2)"}
    )
    assert half.r_type == 0.5 and half.reward == pytest.approx(0.5)
    long_goal = Goal(**{**GOAL.__dict__, "name": GOAL.name + " Pack Thick Cut Crispy Maple Breakfast Rashers Deli"})
    assert webshop_reward(product(title="Acme Ground Coffee", **other_type), long_goal, 25.0, {}).r_type == 0.1
    assert webshop_reward(product(title="Dark Roast Ground Coffee", **other_type), GOAL, 25.0, {}).reward == 0.0


# episodes


def test_buying_ends_the_episode_with_webshop_reward(env):
    env.reset(7)
    goal = env.goal
    first_step = env.step(f"search[{search_keywords(goal.instruction)}]")
    assert first_step.reward == 0.0 and first_step.info == {"won": False, "score": 0.0, "invalid": False}
    env.step(f"click[{goal.asin}]")
    result = env.step("Click[Buy Now]")  # names and values are case-insensitive, as in WebShop
    assert result.done and result.reward == result.info["score"] == result.score
    expected = webshop_reward(env.catalog.by_asin[goal.asin], goal, env.catalog.by_asin[goal.asin].price, {})
    assert result.reward == pytest.approx(expected.reward)
    assert result.won is (result.reward == 1.0)
    assert result.info["purchased"]["asin"] == goal.asin
    assert result.observation.startswith(
        f"Thank you for shopping with us! [SEP] Purchased [SEP] asin [SEP] {goal.asin}"
    )
    assert env.admissible_actions() == [] and env.expert_action() is None
    with pytest.raises(EpisodeFinishedError):
        env.step("click[back to search]")


def test_expert_wins_at_least_95_percent_of_test_goals(env):
    results = [play_expert(env, task_id) for task_id in env.task_ids("test")]
    wins = sum(r.won for r in results)
    assert wins / len(results) >= 0.95, f"expert won {wins} of {len(results)}"
    assert all(r.done and r.info["score"] == r.reward for r in results)


def test_expert_pages_to_a_product_beyond_the_first_page(env):
    task_id = next(
        t
        for t in env.task_ids("train")
        if env.catalog.goals[t].asin in env.shop.index.search(search_keywords(env.catalog.goals[t].instruction))[10:]
    )
    env.reset(task_id)
    actions = []
    while not env.done:
        actions.append(env.expert_action())
        env.step(actions[-1])
    assert "click[next >]" in actions and env.score == 1.0


def test_expert_recovers_from_a_search_that_is_not_its_own(env):
    """A person (or a model) searched something else and opened a wrong product: the expert goes back
    to search instead of buying what is on the page."""
    task_id = next(t for t in env.task_ids("test") if play_expert(env, t).won)
    goal = env.catalog.goals[task_id]
    env.reset(task_id)
    wrong = next(a for a in env.shop.index.search("zzzz banana phone")[:10] if a != goal.asin)
    env.step("search[zzzz banana phone]")
    assert goal.asin not in env.state.results  # this search did not find the goal
    env.step(f"click[{wrong}]")
    assert env.expert_action() == "click[back to search]"
    while not env.done:
        env.step(env.expert_action())
    assert env.score == 1.0


def test_tools_and_action_help_describe_search_and_click(env):
    assert [t["name"] for t in env.tools] == ["search", "click"]
    assert env.tools[0]["parameters"]["required"] == ["keywords"]
    assert env.tools[1]["parameters"]["properties"]["value"]["type"] == "string"
    assert env.action_from_tool_call("click", {"value": "buy now"}) == "click[buy now]"
    assert "search[keywords]" in env.action_help and "click[value]" in env.action_help


# WebShop's own files and options


def write_webshop_files(tmp_path: Path) -> dict[str, str]:
    """Tiny items_shuffle / items_ins_v2 / items_human_ins files in WebShop's own format."""
    items = [
        {
            "asin": "B07CRAVEN1",
            "name": "Earth Mama Smoked Peppered Vegetarian Bacon",
            "category": "grocery",
            "query": "Bacon ",
            "product_category": "Grocery & Gourmet Food › Meat Substitutes › Bacon",
            "pricing": "$12.99",
            "small_description": "Gluten free plant based bacon.",
            "full_description": "Smoky strips made from wheat-free protein.",
            "customization_options": {
                "Size": [
                    {"value": "4 Ounce (Pack of 2)", "image": None},
                    {"value": "4 Ounce (Pack of 1)", "image": None},
                ],
                "Flavor Name": [{"value": "Peppered/Smoked", "image": None}],
            },
            "images": ["x.jpg"],
            "Reviews": [{"title": "Tasty", "stars": "5", "review": "Great on toast"}],
        },
        {
            "asin": "B07SHOE002",
            "name": "Trail Runner Running Shoes",
            "category": "fashion",
            "query": "running shoes",
            "product_category": "Clothing › Shoes › Running",
            "pricing": "$40.00 - $55.50",
            "small_description": ["Non slip rubber sole"],
            "full_description": "Light shoes.",
            "customization_options": {"color": [{"value": "Black/White"}]},
        },
        {
            "asin": "B07SHOE002",
            "name": "a repeated ASIN is skipped",
            "category": "fashion",
            "query": "x",
            "product_category": "x",
            "pricing": "$1",
            "small_description": [],
            "full_description": "",
            "customization_options": {},
        },
        {
            "asin": "B07LAMP003",
            "name": "Desk Lamp",
            "category": "garden",
            "query": "lamp",
            "product_category": "Home › Lamps",
            "pricing": "",
            "small_description": [],
            "full_description": "",
            "customization_options": None,
        },
    ]
    attributes = {
        "B07CRAVEN1": {"attributes": ["gluten free", "vegetarian"], "instruction": "", "instruction_attributes": []},
        "B07SHOE002": {"attributes": ["non slip"]},
    }
    human = {
        "B07CRAVEN1": [
            {
                "instruction": "i need gluten free vegetarian smoked peppered bacon - 4 ounce (pack of 2).",
                "instruction_attributes": ["gluten free", "vegetarian"],
                "instruction_options": ["4 ounce (pack of 2)", "peppered | smoked"],
            },
            {
                "instruction": "no attributes: skipped as in WebShop",
                "instruction_attributes": [],
                "instruction_options": [],
            },
        ],
        "B07SHOE002": [
            {
                "instruction": "i want non slip running shoes in black and white",
                "instruction_attributes": ["non slip"],
                "instruction_options": {"color": "black | white"},
            }
        ],
        "B07LAMP003": [{"instruction": "a desk lamp", "instruction_attributes": ["bright"], "instruction_options": []}],
    }
    paths = {}
    for name, data in (
        ("items_shuffle_1000.json", items),
        ("items_ins_v2_1000.json", attributes),
        ("items_human_ins.json", human),
    ):
        (tmp_path / name).write_text(json.dumps(data))
        paths[name] = str(tmp_path / name)
    with gzip.open(tmp_path / "items_human_ins.json.gz", "wt") as f:
        json.dump(human, f)
    return {
        "items_path": paths["items_shuffle_1000.json"],
        "attributes_path": paths["items_ins_v2_1000.json"],
        "human_goals_path": paths["items_human_ins.json"],
    }


def test_loads_webshop_files_and_plays_to_a_reward(tmp_path):
    options = write_webshop_files(tmp_path)
    env = WebShopEnv(**options, num_test_goals=1)
    catalog = env.catalog
    assert [p.asin for p in catalog.products] == ["B07CRAVEN1", "B07SHOE002", "B07LAMP003"]
    bacon = catalog.by_asin["B07CRAVEN1"]
    assert bacon.options == {
        "size": ("4 ounce (pack of 2)", "4 ounce (pack of 1)"),
        "flavor name": ("peppered | smoked",),
    }
    assert bacon.query == "bacon" and bacon.bullet_points == ("Gluten free plant based bacon.",)
    assert bacon.reviews[0].score == "5" and bacon.reviews[0].body == "Great on toast"
    shoes, lamp = catalog.by_asin["B07SHOE002"], catalog.by_asin["B07LAMP003"]
    assert shoes.price_tag == "$40.0 to $55.5" and 40.0 <= shoes.price <= 55.5
    assert lamp.price == 100.0 and lamp.attributes == ("DUMMY_ATTR",)  # WebShop's defaults
    assert len(catalog.goals) == 3 and len(env.task_ids("test")) == 1 and len(env.task_ids("train")) == 2
    task_id = next(i for i, g in enumerate(catalog.goals) if g.asin == "B07CRAVEN1")
    goal = catalog.goals[task_id]
    assert goal.instruction.startswith(
        "i need gluten free vegetarian smoked peppered bacon - 4 ounce (pack of 2), and price lower than "
    )
    assert goal.price_upper in (30.0, 40.0, 50.0)
    result = play_expert(env, task_id)
    assert result.done and result.reward == 1.0 and result.won
    assert result.info["purchased"]["options"] == {"size": "4 ounce (pack of 2)", "flavor name": "peppered | smoked"}


def test_webshop_files_are_cached_per_source(tmp_path):
    options = write_webshop_files(tmp_path)
    assert WebShopEnv(**options).shop is WebShopEnv(**options).shop
    gz = WebShopEnv(**{**options, "human_goals_path": str(tmp_path / "items_human_ins.json.gz")})
    assert gz.shop is not WebShopEnv(**options).shop
    assert [g.instruction for g in gz.catalog.goals] == [g.instruction for g in WebShopEnv(**options).catalog.goals]
    assert len(WebShopEnv(**options, num_products=2).catalog.products) == 2


@pytest.mark.parametrize(
    "options, message",
    [
        ({"catalog": "/data/items.json"}, "does not take options ['catalog']; its options: items_path"),
        ({"items_path": "/nonexistent/items.json", "human_goals_path": "/nonexistent/h.json"}, "is not a file"),
        ({"human_goals_path": "h.json"}, "need items_path"),
        ({"num_products": 0}, "num_products must be a positive whole number"),
        ({"num_test_goals": 5000}, "num_test_goals=5000 must be between 1 and 999"),
    ],
)
def test_bad_options_raise_config_errors(options, message):
    with pytest.raises(ConfigError) as caught:
        create_env(WebShopEnv, options, "webshop")  # as a run builds it
    assert message in str(caught.value)


def test_items_without_human_goals_or_bad_json_raise(tmp_path):
    options = write_webshop_files(tmp_path)
    with pytest.raises(ConfigError, match="needs human_goals_path"):
        WebShopEnv(items_path=options["items_path"])
    (tmp_path / "broken.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        WebShopEnv(**{**options, "attributes_path": str(tmp_path / "broken.json")})
    unknown_asin = {"B0UNKNOWN1": [{"instruction": "x", "instruction_attributes": ["y"]}]}
    (tmp_path / "other.json").write_text(json.dumps(unknown_asin))
    with pytest.raises(ConfigError, match="yields no goals"):
        WebShopEnv(**{**options, "human_goals_path": str(tmp_path / "other.json")})


def test_a_damaged_gz_data_file_is_a_clear_error_naming_it(tmp_path, monkeypatch):
    """A truncated .gz raised EOFError (the CLI said only "Aborted."); a corrupt one zlib.error, called an omrl bug."""
    from omrl_plugins.envs.webshop import catalog

    options = write_webshop_files(tmp_path)
    whole = gzip.compress(Path(options["items_path"]).read_bytes())
    damaged = {"cut.json.gz": whole[: len(whole) // 2], "flipped.json.gz": whole[:20] + bytes(60) + whole[80:]}
    for name, data in damaged.items():
        (tmp_path / name).write_bytes(data)
        with pytest.raises(ConfigError, match=f"items_path '.*{name}' is not valid JSON"):
            WebShopEnv(**{**options, "items_path": str(tmp_path / name)})
    shipped = tmp_path / "shipped.json.gz"
    shipped.write_bytes(gzip.compress(json.dumps({"items": [], "human_goals": {}}).encode()))
    monkeypatch.setattr(catalog, "BUILTIN_DATA", shipped)
    monkeypatch.setattr("omrl_plugins.envs.webshop.env.BUILTIN_DATA", shipped)  # the shops' cache key too
    with pytest.raises(ConfigError, match="shipped catalog .* is damaged \\(no attributes\\); reinstall omrl"):
        WebShopEnv()


def test_env_is_registered():
    from omrl import registry

    assert registry.envs.get("webshop") is WebShopEnv
    assert registry.envs.component("webshop").description.startswith("WebShop in text mode")


def test_the_demonstration_is_a_winning_episode_in_the_shops_own_page_format(env):
    """The worked example reads like the real pages, and each reply is an action the shop accepts."""
    from omrl_plugins.templates.react import ReactTemplate

    demo = WebShopEnv.demonstration
    first = env.reset(env.task_ids("test")[0]).text
    assert demo[0].observation.split("[SEP]")[:2] == first.split("[SEP]")[:2]  # "WebShop", "Instruction:"
    results = env.step(f"search[{demo[0].action[len('search[') : -1]}]").observation

    def header(page: str) -> list[str]:  # back, page and count, next
        return [re.sub(r"\d+", "N", part) for part in page.split("[SEP]")[:3]]

    assert header(demo[1].observation) == header(results)
    assert demo[1].action[len("click[") : -1] in demo[1].observation  # it clicks a product listed there
    assert demo[2].observation.endswith("Buy Now") and demo[2].action == "click[buy now]"
    template = ReactTemplate()
    for turn in demo:
        parsed = template.parse(template.format_action(turn.action, env, turn.thought), env)
        assert parsed.format_ok and parsed.action == turn.action and parsed.thought == turn.thought
