"""WebShop's reward for buying a product with some options, given a goal (Yao et al. 2022).

    r = (|U_att ∩ Y_att| + |U_opt ∩ Y_opt| + 1[price <= bound]) / (|U_att| + |U_opt| + 1) * r_type

Matching follows WebShop's ``goal.py``: an attribute matches by fuzzy token-set
similarity above 85 (rapidfuzz with thefuzz's preprocessing) or by appearing in the
title, bullet points or description; a goal option matches when a chosen option
value is similar above 85 after colour-name normalisation. So, as in WebShop, a
size one digit off ("6 person" for "2 person") can still match. One deviation,
forced: spaCy's noun tagging of titles is replaced by the title's content words
(no spaCy model can be installed).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping

from rapidfuzz import fuzz, utils

from omrl_plugins.envs.webshop.catalog import Goal, Product

FUZZY_THRESHOLD = 85

# Colour names an option value is reduced to before matching ("navy blue" -> "navy").
COLORS = (
    "black",
    "white",
    "grey",
    "gray",
    "silver",
    "gold",
    "rose gold",
    "red",
    "burgundy",
    "wine",
    "maroon",
    "pink",
    "purple",
    "lavender",
    "violet",
    "blue",
    "navy",
    "teal",
    "turquoise",
    "aqua",
    "green",
    "olive",
    "mint",
    "khaki",
    "beige",
    "ivory",
    "cream",
    "tan",
    "brown",
    "coffee",
    "camel",
    "yellow",
    "mustard",
    "orange",
    "coral",
    "peach",
    "multicolor",
    "clear",
    "charcoal",
)
_COLOR_RE = re.compile(r"\b(" + "|".join(sorted(map(re.escape, COLORS), key=len, reverse=True)) + r")\b")

_STOPWORDS = frozenset(
    "a an and are as at be by for from in into is it of on or the to with without your you our "
    "pack count set piece pieces inch inches oz ounce ounces fl lb lbs ft cm mm ml".split()
)


def normalize_color(value: str) -> str:
    """The colour a value names, or the value itself (WebShop's ``normalize_color``)."""
    match = _COLOR_RE.search(value.lower())
    if not match:
        return value
    return "grey" if match.group(1) == "gray" else match.group(1)


def similar(a: str, b: str) -> bool:
    return fuzz.token_set_ratio(a, b, processor=utils.default_process) > FUZZY_THRESHOLD


def _in_text(needle: str, product: Product) -> bool:
    needle = needle.lower()
    return (
        needle in product.title.lower()
        or needle in " ".join(product.bullet_points).lower()
        or needle in product.description.lower()
    )


def title_words(title: str) -> set[str]:
    """A title's content words: WebShop's title nouns, without a part-of-speech tagger."""
    return {w for w in re.findall(r"[a-z][a-z']+", title.lower()) if w not in _STOPWORDS}


def type_reward(product: Product, goal: Goal) -> tuple[float, float]:
    """(r_type, title_score): does the product have the goal product's type?"""
    query_match = product.query == goal.query
    categories = {c.strip() for c in product.product_category.split("›")}
    goal_categories = {c.strip() for c in goal.product_category.split("›")}
    category_match = len((categories & goal_categories) - {""}) >= 2
    wanted = title_words(goal.name)
    title_score = len(title_words(product.title) & wanted) / len(wanted) if wanted else 0.2
    r_type = 1.0 if (query_match or category_match or title_score > 0.2) else 0.5
    if title_score < 0.1:
        r_type = 0.1
    if title_score == 0.0:
        r_type = 0.0
    return r_type, title_score


def attribute_matches(product: Product, goal: Goal) -> int:
    return sum(
        1
        for wanted in goal.attributes
        if any(similar(have, wanted) for have in product.attributes) or _in_text(wanted, product)
    )


def option_matches(goal: Goal, chosen: Mapping[str, str]) -> int:
    """How many of the goal's options some chosen option value matches (each goal option once, as
    WebShop's ``get_option_reward``): the option groups' names and the product's text play no part."""
    values = [normalize_color(v) for v in chosen.values()]
    return sum(1 for wanted in goal.options if any(similar(v, normalize_color(wanted)) for v in values))


@dataclass(frozen=True)
class RewardInfo:
    """The reward and its parts (WebShop's verbose reward info)."""

    reward: float
    r_type: float
    r_att: float
    r_option: float | None
    r_price: bool
    title_score: float


def webshop_reward(product: Product, goal: Goal, price: float, chosen: Mapping[str, str]) -> RewardInfo:
    """The reward of buying ``product`` at ``price`` with options ``chosen`` (group -> value) for ``goal``."""
    r_type, title_score = type_reward(product, goal)
    n_att = attribute_matches(product, goal)
    n_opt = option_matches(goal, chosen)
    r_price = price <= goal.price_upper
    total = (n_att + n_opt + int(r_price)) / (len(goal.attributes) + len(goal.options) + 1)
    return RewardInfo(
        reward=total * r_type,
        r_type=r_type,
        r_att=n_att / len(goal.attributes) if goal.attributes else 1.0,
        r_option=n_opt / len(goal.options) if goal.options else None,
        r_price=r_price,
        title_score=title_score,
    )
