"""A scripted WebShop expert: it reads the goal and the page, and says the next action.

It searches with the instruction's own words, finds the goal's product in the
results (paging as needed), picks the options the instruction names and buys.
Every action uses only text the page shows (ASINs, option values, buttons), so
its episodes are fit to imitate.
"""

from __future__ import annotations

import re

from rapidfuzz import fuzz, utils

from omrl_plugins.envs.webshop.catalog import Catalog, Goal
from omrl_plugins.envs.webshop.pages import (
    BACK_TO_SEARCH,
    BUY_NOW,
    DONE,
    ITEM,
    NEXT_PAGE,
    PREV_PAGE,
    PRODUCTS_PER_PAGE,
    RESULTS,
    SEARCH,
    PageState,
)
from omrl_plugins.envs.webshop.reward import FUZZY_THRESHOLD

_PRICE_CLAUSE = re.compile(r",?\s*and price (lower|less) than [\d.,]+ dollars\s*$")
_OPENINGS = re.compile(
    r"^(i am looking for|i'm looking for|i am searching for|looking for|i need|i want|i would like|i'd like|"
    r"find me|show me|get me|can you find me|can you find|search for|buy me|please find)\s+"
)
_ARTICLES = re.compile(r"^(a|an|some|the|one|two|three|a pair of|a set of)\s+")


def search_keywords(instruction: str) -> str:
    """The instruction without its price clause, polite opening and article."""
    text = _PRICE_CLAUSE.sub("", instruction.lower().strip())
    text = _ARTICLES.sub("", _OPENINGS.sub("", text))
    return " ".join(text.split()) or instruction.lower()


def choose_option(wanted: str, options: dict[str, tuple[str, ...]]) -> tuple[str, str] | None:
    """The (group, value) on the page that best matches a goal option, if any is close enough."""
    best: tuple[float, str, str] | None = None
    for group, values in options.items():
        for value in values:
            if value == wanted.lower():
                return group, value
            score = fuzz.token_set_ratio(wanted, value, processor=utils.default_process)
            if score > FUZZY_THRESHOLD and (best is None or score > best[0]):
                best = (score, group, value)
    return (best[1], best[2]) if best else None


def off_path(goal: Goal, state: PageState) -> bool:
    """Whether the browser holds results of a search the expert would not have made (a person's in
    ``omrl env play``, or a model's) that lack the goal product: then no page of them leads to it.
    On the expert's own path this is never so, so its episodes stay as they were."""
    return (
        state.kind not in (SEARCH, DONE)
        and state.keywords != search_keywords(goal.instruction)
        and goal.asin not in state.results
    )


def next_action(goal: Goal, state: PageState, catalog: Catalog) -> str | None:
    """The expert's action on the page of ``state``; None once the episode is over."""
    if state.kind == SEARCH:
        return f"search[{search_keywords(goal.instruction)}]"
    if off_path(goal, state):  # another search than the expert's, without the goal: start over
        return f"click[{BACK_TO_SEARCH}]"
    if state.kind == RESULTS:
        if goal.asin in state.page_asins:
            return f"click[{goal.asin}]"
        if goal.asin in state.results:
            target_page = state.results.index(goal.asin) // PRODUCTS_PER_PAGE + 1
            return f"click[{NEXT_PAGE if target_page > state.page else PREV_PAGE}]"
        # the product is not among the hits: take the best hit shown
        return f"click[{state.page_asins[0]}]" if state.page_asins else f"click[{BACK_TO_SEARCH}]"
    if state.kind == ITEM:
        if state.asin != goal.asin and goal.asin in state.results:
            return f"click[{PREV_PAGE}]"
        options = catalog.by_asin[state.asin].options
        chosen = state.chosen
        settled: set[str] = set()  # one value per group, so two wishes for one group cannot loop
        for wanted in goal.options:
            match = choose_option(wanted, options)
            if match is None or match[0] in settled:
                continue
            settled.add(match[0])
            if chosen.get(match[0]) != match[1]:
                return f"click[{match[1]}]"
        return f"click[{BUY_NOW}]"
    if state.kind in ("description", "features", "reviews"):
        return f"click[{PREV_PAGE}]"
    return None
