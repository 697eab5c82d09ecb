"""The ``webshop`` env: WebShop's text mode over a shipped catalog or WebShop's own files."""

from __future__ import annotations

import os
import re
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from omrl.envs import DemoTurn, Env, EpisodeFinishedError, Observation, StepResult, UnknownTaskError, check_task
from omrl.errors import ConfigError
from omrl_plugins.envs.webshop import expert
from omrl_plugins.envs.webshop.catalog import BUILTIN_DATA, Catalog, Goal, load_catalog
from omrl_plugins.envs.webshop.pages import BUY_NOW, DONE, Page, PageState, click, render, search
from omrl_plugins.envs.webshop.reward import webshop_reward

if TYPE_CHECKING:
    from omrl_plugins.envs.webshop.search import SearchIndex

_ACTION = re.compile(r"^\s*([A-Za-z_]+)\s*\[(.*)\]\s*$", re.DOTALL)


@dataclass(frozen=True)
class Shop:
    """A catalog and its search index: loaded once per data source and process, then shared."""

    catalog: Catalog
    index: SearchIndex


_SHOPS: dict[tuple, Shop] = {}
_SHOPS_LOCK = threading.Lock()


def _file_key(path: str | None) -> tuple | None:
    if path is None:
        return None
    resolved = Path(path).expanduser().resolve()
    try:
        stat = os.stat(resolved)
    except OSError:
        return (str(resolved),)  # loading will say what is wrong with it
    return (str(resolved), stat.st_mtime_ns, stat.st_size)


def shared_shop(
    items_path: str | None = None,
    attributes_path: str | None = None,
    human_goals_path: str | None = None,
    num_products: int | None = None,
    num_test_goals: int | None = None,
) -> Shop:
    """The Shop of a data source, built on first use (changed files make a new one)."""
    key = (
        _file_key(items_path) or _file_key(str(BUILTIN_DATA)),
        _file_key(attributes_path),
        _file_key(human_goals_path),
        num_products,
        num_test_goals,
    )
    with _SHOPS_LOCK:
        shop = _SHOPS.get(key)
        if shop is None:
            # imported here: bm25s and numpy take a third of a second, and listing plugins needs neither
            from omrl_plugins.envs.webshop.search import SearchIndex

            catalog = load_catalog(items_path, attributes_path, human_goals_path, num_products, num_test_goals)
            shop = _SHOPS[key] = Shop(catalog, SearchIndex(catalog.products))
        return shop


@dataclass(frozen=True)
class WebShopState:
    """A live episode, as ``WebShopEnv.snapshot`` returns it: the goal and the (immutable) page state."""

    goal: Goal
    page_state: PageState
    done: bool
    score: float


class WebShopEnv(Env):
    """WebShop in text mode: search a shop, open products, pick options and buy what the instruction asks.

    Options (the config's ``plugins.webshop`` block): ``items_path``,
    ``attributes_path`` and ``human_goals_path`` load WebShop's own
    ``items_shuffle*.json``, ``items_ins_v2*.json`` and ``items_human_ins.json``
    instead of the shipped catalog; ``num_products`` keeps the first N items;
    ``num_test_goals`` sizes the test split (default: a fifth of the goals, at most 500).

    Forking is cheap: every action makes a new immutable ``PageState``, so ``snapshot()`` is a
    small frozen :class:`WebShopState` and ``restore`` only redraws the page.
    """

    action_help = (
        "Act with exactly one action per turn: search[keywords] on the search page, or click[value] "
        "where value is something clickable on the current page: a product ID from the results "
        "(e.g. click[B07XK2M9QZ]), an option value (e.g. click[large]), or a button: click[back to search], "
        "click[next >], click[< prev], click[description], click[features], click[reviews], click[buy now]. "
        "Buying ends the episode."
    )
    tools = [
        {
            "name": "search",
            "description": "Search the shop for products. Only possible on the search page.",
            "parameters": {
                "type": "object",
                "properties": {"keywords": {"type": "string", "description": "What to search for."}},
                "required": ["keywords"],
            },
        },
        {
            "name": "click",
            "description": "Click something shown on the current page: a product ID, an option value, "
            "or a button (back to search, next >, < prev, description, features, reviews, buy now).",
            "parameters": {
                "type": "object",
                "properties": {"value": {"type": "string", "description": "The clickable's text, e.g. buy now."}},
                "required": ["value"],
            },
        },
    ]
    max_turns = 15
    deterministic = True  # BM25 search and the reward depend on the actions alone
    # a short made-up episode in the shop's own page format (not a product of the catalog)
    demonstration = (
        DemoTurn(
            "WebShop [SEP] Instruction: [SEP] i want a noise cancelling usb microphone, and price lower than "
            "60.00 dollars [SEP] Search",
            "I should search for the product first.",
            "search[noise cancelling usb microphone]",
        ),
        DemoTurn(
            "Back to Search [SEP] Page 1 (Total results: 50) [SEP] Next > [SEP] B0DEMO1XYZ [SEP] Orbit Studio "
            "Condenser Microphone, XLR [SEP] $89.99 [SEP] B0DEMO2XYZ [SEP] EchoLess USB Microphone, Noise "
            "Cancelling, Plug and Play [SEP] $39.99 [SEP] B0DEMO3XYZ [SEP] Pocket Lavalier Microphone "
            "[SEP] $12.49",
            "The second result is a noise cancelling USB microphone under 60 dollars.",
            "click[B0DEMO2XYZ]",
        ),
        DemoTurn(
            "Back to Search [SEP] < Prev [SEP] EchoLess USB Microphone, Noise Cancelling, Plug and Play "
            "[SEP] Price: $39.99 [SEP] Rating: N.A. [SEP] Description [SEP] Features [SEP] Reviews [SEP] "
            "Buy Now",
            "It matches the instruction and the price. I will buy it.",
            "click[buy now]",
        ),
    )

    def __init__(
        self,
        *,
        items_path: str | None = None,
        attributes_path: str | None = None,
        human_goals_path: str | None = None,
        num_products: int | None = None,
        num_test_goals: int | None = None,
    ):
        for name, value in (("num_products", num_products), ("num_test_goals", num_test_goals)):
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ConfigError(f"webshop: {name} must be a positive whole number, got {value!r}")
        self.shop = shared_shop(items_path, attributes_path, human_goals_path, num_products, num_test_goals)
        self.catalog = self.shop.catalog
        self.goal: Goal | None = None
        self.state = PageState()
        self.page: Page | None = None
        self.done = True
        self.score = 0.0

    def task_ids(self, split: str) -> Sequence[int]:
        if split == "train":
            return self.catalog.train_ids
        if split == "test":
            return self.catalog.test_ids
        raise UnknownTaskError(f"WebShopEnv has no split {split!r}; valid: {', '.join(self.splits)}")

    def reset(self, task_id: int) -> Observation:
        check_task(self, task_id, range(len(self.catalog.goals)))
        self.goal = self.catalog.goals[task_id]
        self.done = False
        self.score = 0.0
        self._go(PageState())
        return Observation(self.page.text, self.goal.instruction, {"task_id": task_id})

    def _go(self, state: PageState) -> None:
        self.state = state
        self.page = render(state, self.catalog, self.goal.instruction, self.score)

    def _invalid(self, reason: str) -> StepResult:
        return StepResult(
            f"Invalid action: {reason}\n{self.page.text}", 0.0, False, {"won": False, "score": 0.0, "invalid": True}
        )

    def step(self, action: str) -> StepResult:
        if self.done:
            raise EpisodeFinishedError("the webshop episode is over (or was never started); call reset(task_id)")
        match = _ACTION.match(action if isinstance(action, str) else "")
        if match is None:
            return self._invalid(f"could not read {action!r}; write search[keywords] or click[value].")
        name, value = match.group(1).lower(), " ".join(match.group(2).split())
        if name == "search":
            if not self.page.has_search_bar:
                return self._invalid("there is no search bar on this page; click[back to search] first.")
            if not value:
                return self._invalid("search[] needs keywords, e.g. search[red running shoes].")
            self._go(search(value, self.shop.index))
        elif name == "click":
            label = value.lower()
            if label not in self.page.clickables:
                shown = ", ".join(self.page.clickables.values())
                where = f"clickables here: {shown}" if shown else "nothing is clickable here; use search[keywords]"
                return self._invalid(f"{value!r} is not clickable on this page ({where}).")
            if label == BUY_NOW:
                return self._buy()
            self._go(click(self.state, label, self.catalog))
        else:
            return self._invalid(f"unknown action {name!r}; the actions are search[keywords] and click[value].")
        return StepResult(self.page.text, 0.0, False, {"won": False, "score": 0.0, "invalid": False})

    def _buy(self) -> StepResult:
        product = self.catalog.by_asin[self.state.asin]
        chosen = self.state.chosen
        info = webshop_reward(product, self.goal, product.price, chosen)
        self.done = True
        self.score = info.reward
        self._go(PageState(kind=DONE, asin=product.asin, options=self.state.options))
        return StepResult(
            self.page.text,
            info.reward,
            True,
            {
                "won": info.reward == 1.0,
                "score": info.reward,
                "invalid": False,
                "purchased": {"asin": product.asin, "options": chosen, "price": product.price},
                "reward_info": asdict(info),
            },
        )

    def snapshot(self) -> WebShopState:
        if self.goal is None:
            raise EpisodeFinishedError("webshop: no episode to snapshot; call reset(task_id) first")
        return WebShopState(self.goal, self.state, self.done, self.score)

    def restore(self, state: WebShopState) -> None:
        self.goal, self.done, self.score = state.goal, state.done, state.score
        self._go(state.page_state)  # a fresh Page: its clickables dict is this instance's own

    def admissible_actions(self) -> list[str] | None:
        if self.page is None or self.done:
            return []
        actions = ["search[<query>]"] if self.page.has_search_bar else []
        return actions + [f"click[{label}]" for label in self.page.clickables.values()]

    def expert_action(self) -> str | None:
        if self.done or self.goal is None:
            return None
        return expert.next_action(self.goal, self.state, self.catalog)
