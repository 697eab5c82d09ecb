"""The shop's pages: where the browser is, what each page shows, and where clicks lead.

A :class:`PageState` is immutable: every valid action makes a new one, so an
invalid action changes nothing by construction. :func:`render` gives WebShop's
simple text mode (visible text joined with `` [SEP] ``) and the page's clickables;
:func:`search` and :func:`click` follow WebShop's ``SimServer.receive``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from omrl_plugins.envs.webshop.catalog import Catalog

if TYPE_CHECKING:
    from omrl_plugins.envs.webshop.search import SearchIndex

SEP = " [SEP] "
PRODUCTS_PER_PAGE = 10  # WebShop's PRODUCT_WINDOW

BACK_TO_SEARCH = "back to search"
NEXT_PAGE = "next >"
PREV_PAGE = "< prev"
BUY_NOW = "buy now"
SUB_PAGES = ("description", "features", "reviews")

SEARCH, RESULTS, ITEM, DONE = "search", "results", "item", "done"


@dataclass(frozen=True)
class PageState:
    """Where the browser is: the page kind plus what it needs to be drawn."""

    kind: str = SEARCH  # search, results, item, description, features, reviews, done
    keywords: str = ""
    results: tuple[str, ...] = ()  # ASINs of the last search, best first (at most 50)
    page: int = 1
    asin: str = ""
    options: tuple[tuple[str, str], ...] = ()  # chosen (group, value) pairs

    @property
    def chosen(self) -> dict[str, str]:
        return dict(self.options)

    @property
    def page_asins(self) -> tuple[str, ...]:
        start = (self.page - 1) * PRODUCTS_PER_PAGE
        return self.results[start : start + PRODUCTS_PER_PAGE]

    @property
    def has_next_page(self) -> bool:
        return self.page * PRODUCTS_PER_PAGE < len(self.results)


@dataclass(frozen=True)
class Page:
    """A rendered page: its text and its clickables (lower-cased label -> label as shown)."""

    text: str
    clickables: dict[str, str]
    has_search_bar: bool


def _buttons(*labels: str) -> dict[str, str]:
    return {label: label for label in labels}


def render(state: PageState, catalog: Catalog, instruction: str, score: float = 0.0) -> Page:
    """The page of ``state`` in WebShop's text mode."""
    if state.kind == SEARCH:
        return Page(SEP.join(["WebShop", "Instruction:", instruction, "Search"]), {}, True)
    if state.kind == RESULTS:
        parts = ["Back to Search", f"Page {state.page} (Total results: {len(state.results)})"]
        clickables = _buttons(BACK_TO_SEARCH)
        if state.page > 1:
            parts.append("< Prev")
            clickables[PREV_PAGE] = PREV_PAGE
        if state.has_next_page:
            parts.append("Next >")
            clickables[NEXT_PAGE] = NEXT_PAGE
        for asin in state.page_asins:
            product = catalog.by_asin[asin]
            parts += [asin, product.title, product.price_tag]
            clickables[asin.lower()] = asin
        return Page(SEP.join(parts), clickables, False)
    if state.kind == DONE:
        options = json.dumps(state.chosen)
        text = SEP.join(
            [
                "Thank you for shopping with us!",
                "Purchased",
                "asin",
                state.asin,
                "options",
                options,
                "Your score (min 0.0, max 1.0)",
                str(round(score, 4)),
            ]
        )
        return Page(text, {}, False)
    product = catalog.by_asin[state.asin]
    parts = ["Back to Search", "< Prev"]
    if state.kind == ITEM:
        clickables: dict[str, str] = {}
        for group, values in product.options.items():
            parts.append(group)
            for value in values:
                parts.append(value)
                clickables.setdefault(value, value)
        parts += [
            product.title,
            f"Price: {product.price_tag}",
            f"Rating: {product.rating}",
            "Description",
            "Features",
            "Reviews",
            "Buy Now",
        ]
        # buttons win over an option value that reads the same
        clickables.update(_buttons(BACK_TO_SEARCH, PREV_PAGE, *SUB_PAGES, BUY_NOW))
        return Page(SEP.join(parts), clickables, False)
    if state.kind == "description":
        parts.append(product.description)
    elif state.kind == "features":
        parts += product.bullet_points
    else:
        for review in product.reviews:
            parts += [review.title, review.score, review.body]
    return Page(SEP.join(p for p in parts if p), _buttons(BACK_TO_SEARCH, PREV_PAGE), False)


def search(keywords: str, index: SearchIndex) -> PageState:
    """The first results page for ``keywords``."""
    keywords = " ".join(keywords.lower().split())
    return PageState(kind=RESULTS, keywords=keywords, results=index.search(keywords))


def click(state: PageState, label: str, catalog: Catalog) -> PageState:
    """Where clicking ``label`` (a lower-cased clickable of the rendered page) leads."""
    if label == BACK_TO_SEARCH:
        return PageState()
    if state.kind == RESULTS:
        if label == NEXT_PAGE:
            return replace(state, page=state.page + 1)
        if label == PREV_PAGE:
            return replace(state, page=state.page - 1)
        asin = next(a for a in state.page_asins if a.lower() == label)
        return replace(state, kind=ITEM, asin=asin, options=())
    if label == PREV_PAGE:  # item -> its results page; sub-page -> its item page
        return replace(state, kind=RESULTS if state.kind == ITEM else ITEM)
    if label in SUB_PAGES:
        return replace(state, kind=label)
    if label == BUY_NOW:
        return replace(state, kind=DONE)
    group = next(g for g, values in catalog.by_asin[state.asin].options.items() if label in values)
    chosen = {**state.chosen, group: label}
    return replace(state, options=tuple(chosen.items()))
