"""Products and goals, read from WebShop's own data format.

The shipped catalog (``data/webshop_catalog.json.gz``, written by
``scripts/build_webshop_data.py``) holds the three WebShop files in one archive:
``{"items": [...], "attributes": {...}, "human_goals": {...}}``, with the field
names of ``items_shuffle*.json``, ``items_ins_v2*.json`` and
``items_human_ins.json``. Both sources go through :func:`build_catalog`, which
converts them the way WebShop's ``load_products`` and ``get_human_goals`` do.
"""

from __future__ import annotations

import gzip
import json
import random
import re
import zlib
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

from omrl.errors import ConfigError

BUILTIN_DATA = Path(__file__).resolve().parent / "data" / "webshop_catalog.json.gz"

#: WebShop's goal price bounds: 10-dollar steps.
PRICE_STEPS = [10.0 * i for i in range(1, 100)]
#: WebShop's seed for shuffling goals before the split.
GOAL_SHUFFLE_SEED = 233
#: Goals with no price step above the product's price get no bound (WebShop's 1,000,000).
NO_PRICE_BOUND = 1_000_000.0
#: The attribute WebShop gives a product with none in the attributes file.
DUMMY_ATTRIBUTE = "DUMMY_ATTR"


@dataclass(frozen=True)
class Review:
    title: str
    score: str
    body: str


@dataclass(frozen=True)
class Product:
    """One product as the site shows it (WebShop's cleaned product record)."""

    asin: str
    title: str
    category: str
    query: str
    product_category: str
    price: float  # what buying costs: the price, or a fixed draw inside a price range
    price_tag: str  # as shown: "$12.99" or "$10.0 to $15.5"
    options: dict[str, tuple[str, ...]]  # option group -> values, lower-cased
    bullet_points: tuple[str, ...]
    description: str
    reviews: tuple[Review, ...]
    rating: str
    attributes: tuple[str, ...]


@dataclass(frozen=True)
class Goal:
    """One instruction: the target product's type and what the buyer asks for."""

    asin: str  # the product the instruction was written for
    instruction: str  # includes the price clause, as WebShop shows it
    attributes: tuple[str, ...]
    options: tuple[str, ...]
    price_upper: float
    query: str  # the target's query, category path and title, for the type reward
    product_category: str
    name: str


@dataclass
class Catalog:
    """All products and goals of one data source; goal index = task id."""

    products: list[Product]
    by_asin: dict[str, Product]
    goals: list[Goal]
    test_ids: range
    train_ids: range
    source: str


def read_json(path: str | Path, what: str) -> Any:
    """Read a JSON file (gzip when the name ends in .gz); a clear error when it is missing or bad."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise ConfigError(f"webshop: {what} {str(path)!r} is not a file; give the path to WebShop's JSON file")
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError, EOFError, zlib.error) as exc:  # EOFError, zlib.error: a damaged .gz
        raise ConfigError(f"webshop: {what} {str(path)!r} is not valid JSON: {exc}") from exc


def parse_pricing(pricing: Any, asin: str) -> tuple[float, str]:
    """WebShop's pricing text ("$12.99", "$10 - $15.50") -> (price paid, price tag).

    A range is paid at a fixed draw inside it (WebShop draws once per load).
    """
    if isinstance(pricing, (int, float)):
        numbers = [float(pricing)]
    elif isinstance(pricing, list) and pricing and all(isinstance(p, (int, float)) for p in pricing):
        numbers = [float(p) for p in pricing[:2]]
    else:
        numbers = []
        for part in str(pricing or "").split("$")[1:]:
            try:
                numbers.append(float(Decimal(re.sub(r"[^\d.]", "", part))))
            except InvalidOperation:
                continue
        numbers = numbers[:2]
    if not numbers:
        return 100.0, "$100.0"
    if len(numbers) == 1:
        return numbers[0], f"${numbers[0]}"
    low, high = numbers
    return random.Random(asin).uniform(low, high), f"${low} to ${high}"


def _options(customization: Any) -> dict[str, tuple[str, ...]]:
    options: dict[str, tuple[str, ...]] = {}
    for name, contents in (customization or {}).items():
        if not contents:
            continue
        values = [
            " ".join(str(c["value"] if isinstance(c, dict) else c).replace("/", " | ").lower().split())
            for c in contents
        ]
        options[str(name).lower()] = tuple(v for v in values if v)
    return options


def _reviews(raw: Any) -> tuple[Review, ...]:
    reviews = []
    for r in raw or []:
        if isinstance(r, dict):
            score = r.get("score", r.get("stars", ""))
            reviews.append(Review(str(r.get("title", "")), str(score), str(r.get("body", r.get("review", "")))))
    return tuple(reviews)


def product_from_item(item: dict[str, Any], attributes: dict[str, Any]) -> Product:
    """One ``items_shuffle`` record (plus its ``items_ins_v2`` entry) -> Product."""
    asin = str(item["asin"])
    bullets = item.get("BulletPoints", item.get("small_description", []))
    bullets = bullets if isinstance(bullets, list) else [bullets]
    price, price_tag = parse_pricing(item.get("pricing"), asin)
    attrs = (attributes.get(asin) or {}).get("attributes") or [DUMMY_ATTRIBUTE]
    return Product(
        asin=asin,
        title=str(item.get("name", "")),
        category=str(item.get("category", "")),
        query=str(item.get("query", "")).lower().strip(),
        product_category=str(item.get("product_category", "")),
        price=price,
        price_tag=price_tag,
        options=_options(item.get("customization_options")),
        bullet_points=tuple(str(b) for b in bullets if b),
        description=str(item.get("full_description") or item.get("Description") or ""),
        reviews=_reviews(item.get("Reviews")),
        rating=str(item.get("Rating", "N.A.")),
        attributes=tuple(str(a) for a in attrs),
    )


def price_bound(price: float, rng: random.Random) -> float:
    """WebShop's rule: the larger of two draws from the first four 10-dollar steps above the price."""
    steps = [p for p in PRICE_STEPS if p > price][:4]
    if len(steps) < 2:
        return NO_PRICE_BOUND
    return max(rng.sample(steps, 2))


def goals_for(product: Product, instructions: list[dict[str, Any]]) -> list[Goal]:
    """The goals of ``items_human_ins.json`` for one product (those with attributes)."""
    goals = []
    for k, ins in enumerate(instructions):
        attributes = ins.get("instruction_attributes") or []
        if not attributes:
            continue  # WebShop skips goals without attributes
        options = ins.get("instruction_options") or []
        if isinstance(options, dict):
            options = list(options.values())
        upper = price_bound(product.price, random.Random(f"{product.asin}:{k}"))
        price_text = f", and price lower than {upper:.2f} dollars" if upper != NO_PRICE_BOUND else ""
        goals.append(
            Goal(
                asin=product.asin,
                instruction=str(ins["instruction"]).strip().strip(".") + price_text,
                attributes=tuple(str(a) for a in attributes),
                options=tuple(str(o) for o in options),
                price_upper=upper,
                query=product.query,
                product_category=product.product_category,
                name=product.title,
            )
        )
    return goals


def build_catalog(
    items: list[dict[str, Any]],
    attributes: dict[str, Any],
    human_goals: dict[str, Any],
    source: str,
    num_products: int | None = None,
    num_test_goals: int | None = None,
) -> Catalog:
    """WebShop's three files -> a Catalog with a train/test split of the goals.

    Goals are shuffled with WebShop's seed; the first ``num_test_goals`` (default:
    a fifth, at most 500 as in WebShop's evaluation) are the test split.
    """
    if not isinstance(items, list) or not isinstance(attributes, dict) or not isinstance(human_goals, dict):
        raise ConfigError(
            f"webshop: {source} does not have WebShop's layout: items must be a list, "
            "attributes and human goals objects keyed by ASIN"
        )
    if num_products is not None:
        items = items[:num_products]
    products: list[Product] = []
    by_asin: dict[str, Product] = {}
    try:
        for item in items:
            asin = str(item.get("asin", ""))
            if asin in by_asin or not asin or asin == "nan" or len(asin) > 10:
                continue  # WebShop's filter of bad and repeated ASINs
            product = product_from_item(item, attributes)
            products.append(product)
            by_asin[asin] = product
        goals = [g for p in products for g in goals_for(p, human_goals.get(p.asin) or [])]
    except (KeyError, TypeError, AttributeError) as exc:
        raise ConfigError(f"webshop: a record in {source} lacks a field WebShop's format has: {exc!r}") from exc
    if not goals:
        raise ConfigError(
            f"webshop: {source} yields no goals: the human goals must name ASINs of the items "
            "and have instruction_attributes"
        )
    random.Random(GOAL_SHUFFLE_SEED).shuffle(goals)
    n_test = min(500, max(1, len(goals) // 5)) if num_test_goals is None else num_test_goals
    if not 0 < n_test < len(goals):
        raise ConfigError(
            f"webshop: num_test_goals={n_test} must be between 1 and {len(goals) - 1} ({len(goals)} goals in {source})"
        )
    return Catalog(products, by_asin, goals, range(0, n_test), range(n_test, len(goals)), source)


def load_catalog(
    items_path: str | None = None,
    attributes_path: str | None = None,
    human_goals_path: str | None = None,
    num_products: int | None = None,
    num_test_goals: int | None = None,
) -> Catalog:
    """The shipped catalog, or WebShop's own files when ``items_path`` is given."""
    if items_path is None:
        if attributes_path or human_goals_path:
            raise ConfigError(
                "webshop: attributes_path and human_goals_path need items_path (WebShop's items_shuffle*.json)"
            )
        data = read_json(BUILTIN_DATA, "shipped catalog")
        missing = [
            key for key in ("items", "attributes", "human_goals") if not isinstance(data, dict) or key not in data
        ]
        if missing:
            raise ConfigError(
                f"webshop: the shipped catalog {str(BUILTIN_DATA)!r} is damaged (no {', '.join(missing)}); "
                "reinstall omrl"
            )
        return build_catalog(
            data["items"], data["attributes"], data["human_goals"], "the shipped catalog", num_products, num_test_goals
        )
    if human_goals_path is None:
        raise ConfigError(
            "webshop: items_path needs human_goals_path (WebShop's items_human_ins.json): the goals come from it"
        )
    items = read_json(items_path, "items_path")
    attributes = read_json(attributes_path, "attributes_path") if attributes_path else {}
    human_goals = read_json(human_goals_path, "human_goals_path")
    return build_catalog(items, attributes, human_goals, str(items_path), num_products, num_test_goals)
