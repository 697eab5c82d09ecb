"""The shop's full-text search: BM25 (``bm25s``) over WebShop's product documents.

WebShop indexes each product with Lucene (English stop words, Porter stemming)
as ``title + description + first bullet point + option texts`` and returns the
top 50 hits; this index does the same with bm25s and PyStemmer's Porter stemmer.
Only documents sharing a term with the query are hits, as in Lucene.
"""

from __future__ import annotations

import sys
import threading
from collections import OrderedDict

import numpy as np
import Stemmer

from omrl_plugins.envs.webshop.catalog import Product


def _bm25s_without_jax():
    """bm25s, imported with jax out of its reach. Where jax is installed, bm25s runs a top-k through it
    at import, which starts JAX, and JAX takes 75% of the GPU's memory by default: on an H100 importing
    bm25s left the policy 19 GiB of 80. This index scores with numpy alone. A process that imported jax
    itself keeps it."""
    if "jax" in sys.modules:
        import bm25s

        return bm25s
    sys.modules["jax"] = None  # makes `import jax.lax` an ImportError, which bm25s catches
    try:
        import bm25s
    finally:
        del sys.modules["jax"]
    return bm25s


bm25s = _bm25s_without_jax()

#: WebShop's SEARCH_RETURN_N.
TOP_K = 50
_CACHE_SIZE = 4096


def document_text(product: Product) -> str:
    """The text WebShop indexes for a product."""
    options = ", and ".join(f"{name}: {', '.join(values)}" for name, values in product.options.items())
    first_bullet = product.bullet_points[0] if product.bullet_points else ""
    return " ".join([product.title, product.description, first_bullet, options]).lower()


class SearchIndex:
    """A BM25 index over a product list; ``search`` returns ASINs, best first.

    Built once per data source and shared by every env instance of the process
    (reads only; a small lock guards the query cache).
    """

    def __init__(self, products: list[Product]):
        self._asins = [p.asin for p in products]
        self._stemmer = Stemmer.Stemmer("porter")
        tokens = bm25s.tokenize(
            [document_text(p) for p in products], stopwords="en", stemmer=self._stemmer, show_progress=False
        )
        self._bm25 = bm25s.BM25()
        self._bm25.index(tokens, show_progress=False)
        self._cache: OrderedDict[tuple[str, ...], tuple[str, ...]] = OrderedDict()
        self._lock = threading.Lock()

    def query_terms(self, keywords: str) -> list[str]:
        """The stemmed, stop-word-free terms of a query that occur in the index."""
        terms = bm25s.tokenize(
            [keywords.lower()], stopwords="en", stemmer=self._stemmer, return_ids=False, show_progress=False
        )[0]
        return [t for t in terms if t in self._bm25.vocab_dict]

    def search(self, keywords: str, k: int = TOP_K) -> tuple[str, ...]:
        """The ASINs of the top ``k`` hits (ties keep catalog order)."""
        terms = tuple(self.query_terms(keywords))
        if not terms:
            return ()
        with self._lock:
            if terms in self._cache:
                self._cache.move_to_end(terms)
                return self._cache[terms][:k]
        scores = self._bm25.get_scores(list(terms))
        order = np.argsort(-scores, kind="stable")[:TOP_K]
        hits = tuple(self._asins[i] for i in order if scores[i] > 0)
        with self._lock:
            self._cache[terms] = hits
            if len(self._cache) > _CACHE_SIZE:
                self._cache.popitem(last=False)
        return hits[:k]
