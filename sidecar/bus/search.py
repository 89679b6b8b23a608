"""BM25 ranking of tool documents for the ``tool_search`` built-in: pure, in memory, no I/O.

A document is a tool's name, description and parameter names, field-weighted (name 3x, parameter
names 1.5x, description 1x) as weighted term frequencies; the document length is the weighted length.
An inverted index (term → {key: weighted tf}) means a query touches only its own terms' postings, and
document frequencies and the total length are kept incrementally by ``add`` and ``remove``.

Contract of ``search``: a key appears only if it matches at least one query term *and* ``allowed(key)``
is true — the filter applies before the limit, so a disallowed tool never appears and never costs a
slot, whatever it scores. ``allowed`` is called only for matching keys, best first, until ``limit``
results are found. A tool whose name the query is (case-insensitive), or whose name tokens all appear
in the query, ranks above every tool without such a match. Ties break by key. An empty or
all-stop-word query gives ``[]``.

Not ``rank-bm25``: it pulls numpy (+~20 MB RSS against an 80 MB idle budget) and is unmaintained.
"""

from __future__ import annotations

import heapq
import itertools
import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Final, TypeVar

__all__ = ["MAX_LIMIT", "SearchIndex", "tokenize"]

MAX_LIMIT: Final = 100
"""Most results one ``search`` may ask for."""

# Weights are counted in half-occurrences so every length is an integer: the running total then
# survives any sequence of add/remove exactly (a float sum would drift), so scores are reproducible.
_HALVES_PER_NAME_TOKEN: Final = 6  # 3x
_HALVES_PER_PARAMETER_TOKEN: Final = 3  # 1.5x
_HALVES_PER_DESCRIPTION_TOKEN: Final = 2  # 1x

_STOP_WORDS: Final = frozenset(
    [
        "the",
        "a",
        "an",
        "of",
        "to",
        "for",
        "and",
        "or",
        "in",
        "on",
        "with",
        "is",
        "it",
        "this",
        "that",
        "by",
        "from",
        "as",
        "at",
        "be",
    ],
)
_WORD: Final = re.compile(r"[^\W_]+")  # alphanumeric runs: splits on `_`, `.`, `-`, spaces, punctuation
# lower/digit→Upper (getCurrent → get|Current) and acronym→Word (HTTPServer → HTTP|Server).
_CAMEL: Final = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")
_ES_PLURALS: Final = ("sses", "xes", "ches", "shes")  # addresses, boxes, searches, pushes: drop "es"
_NOT_PLURALS: Final = ("ss", "us", "is")  # access, status, analysis: keep the "s"

_K = TypeVar("_K")


def tokenize(text: str) -> list[str]:
    """The terms of ``text``, in order, as both documents and queries are indexed.

    Lowercased; split on anything not a letter or digit (so on ``_``, ``.``, ``-``) and on camelCase
    boundaries; digits kept; one-character tokens and stop words dropped; plurals lightly folded
    (``files`` → ``file``, ``directories`` → ``directory``).
    """
    terms: list[str] = []
    for word in _WORD.findall(text):
        for part in _CAMEL.split(word):
            token = part.lower()
            if len(token) > 1 and token not in _STOP_WORDS:
                terms.append(_singular(token))
    return terms


def _singular(token: str) -> str:
    if len(token) <= 3 or not token.endswith("s") or token.endswith(_NOT_PLURALS):
        return token
    if token.endswith("ies") and len(token) > 4:
        return token[:-3] + "y"
    if token.endswith(_ES_PLURALS):
        return token[:-2]
    return token[:-1]


@dataclass(frozen=True, slots=True)
class _Document:
    halves: int
    """Weighted length, in half-occurrences."""
    terms: tuple[str, ...]
    """Distinct terms, to find the postings again on removal."""
    name: str
    """The name, casefolded, for the exact-name lookup."""
    name_terms: tuple[str, ...]
    """Distinct name terms, in order."""
    name_set: frozenset[str]
    """The same, as a set: the key into ``SearchIndex._name_sets``."""


class SearchIndex:
    """BM25 over tool documents: name, description, parameter names (field-weighted)."""

    def __init__(self, *, k1: float = 1.2, b: float = 0.75) -> None:
        if not (math.isfinite(k1) and k1 >= 0):
            raise ValueError(f"k1 must be a finite number >= 0, got {k1!r}")
        if not 0 <= b <= 1:
            raise ValueError(f"b must be within 0..1, got {b!r}")
        self._k1 = k1
        self._b = b
        self._documents: dict[str, _Document] = {}
        self._postings: dict[str, dict[str, float]] = {}
        self._names: dict[str, set[str]] = {}  # casefolded name → keys
        self._name_sets: dict[frozenset[str], set[str]] = {}  # non-empty set of name terms → keys
        self._total_halves = 0
        # key → k1·(1 - b + b·dl/avgdl); depends on the average length, so any add/remove drops it and
        # the next search rebuilds it once (O(N)) instead of every search recomputing it per posting.
        self._norms: dict[str, float] | None = None

    def __len__(self) -> int:
        return len(self._documents)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and key in self._documents

    def add(self, key: str, *, name: str, description: str, parameters: Iterable[str] = ()) -> None:
        """Index a tool under ``key``, replacing whatever ``key`` held before."""
        if isinstance(parameters, str):  # a str is an Iterable[str] of letters, all dropped as too short
            raise TypeError("parameters must be an iterable of parameter names, not one string")
        self.remove(key)
        name_tokens = tokenize(name)
        halves: dict[str, int] = {}
        for tokens, weight in (
            (name_tokens, _HALVES_PER_NAME_TOKEN),
            (tokenize(description), _HALVES_PER_DESCRIPTION_TOKEN),
            ([t for parameter in parameters for t in tokenize(parameter)], _HALVES_PER_PARAMETER_TOKEN),
        ):
            for term in tokens:
                halves[term] = halves.get(term, 0) + weight
        for term, count in halves.items():
            self._postings.setdefault(term, {})[key] = count / 2  # exact: a half-integer
        length = sum(halves.values())
        folded = name.strip().casefold()
        name_set = frozenset(name_tokens)
        self._documents[key] = _Document(length, tuple(halves), folded, tuple(dict.fromkeys(name_tokens)), name_set)
        self._names.setdefault(folded, set()).add(key)
        if name_set:
            self._name_sets.setdefault(name_set, set()).add(key)
        self._total_halves += length
        self._norms = None

    def remove(self, key: str) -> None:
        """Forget ``key``; nothing happens if it is not indexed."""
        document = self._documents.pop(key, None)
        if document is None:
            return
        for term in document.terms:
            posting = self._postings[term]
            del posting[key]
            if not posting:
                del self._postings[term]
        _discard(self._names, document.name, key)
        if document.name_set:
            _discard(self._name_sets, document.name_set, key)
        self._total_halves -= document.halves
        self._norms = None

    def search(
        self,
        query: str,
        *,
        limit: int = 10,
        allowed: Callable[[str], bool] | None = None,
    ) -> list[tuple[str, float]]:
        """The best ``limit`` allowed ``(key, score)`` pairs for ``query``, best first (see module doc).

        Raises ``ValueError`` unless ``1 <= limit <= MAX_LIMIT``.
        """
        if not 1 <= limit <= MAX_LIMIT:
            raise ValueError(f"limit must be within 1..{MAX_LIMIT}, got {limit!r}")
        terms = self._query_terms(query)
        if not terms:
            return []
        norms = self._current_norms()
        count = len(self._documents)
        saturation = self._k1 + 1
        scores: dict[str, float] = {}
        ceiling = 0.0  # no score passes this: a term adds under idf·(k1+1) (equal only if k1 = 0)
        for term in terms:
            posting = self._postings[term]
            df = len(posting)
            idf = math.log(1 + (count - df + 0.5) / (df + 0.5))  # non-negative variant: never below 0
            ceiling += idf * saturation
            get = scores.get
            for key, tf in posting.items():
                scores[key] = get(key, 0.0) + idf * tf * saturation / (tf + norms[key])
        # A name match scores ceiling + a positive BM25 score: above every score without the bonus.
        for key in self._name_matches(terms, scores):
            scores[key] += ceiling
        ranked = [(-score, key) for key, score in scores.items()]
        # A heap, not a sort: ``allowed`` may reject many, and only the popped ones are ever ordered.
        heapq.heapify(ranked)
        results: list[tuple[str, float]] = []
        while ranked and len(results) < limit:
            negative, key = heapq.heappop(ranked)
            if allowed is None or allowed(key):
                results.append((key, -negative))
        return results

    def _query_terms(self, query: str) -> list[str]:
        tokens = tokenize(query)
        if not tokens:
            return []
        # A query that is a tool's name, case aside, also reads as that name's terms: "SENDEMAIL" does
        # not tokenize like "sendEmail", yet it must find it (and then earns the name bonus).
        for key in sorted(self._names.get(query.strip().casefold(), ())):
            tokens.extend(self._documents[key].name_terms)
        return [term for term in dict.fromkeys(tokens) if term in self._postings]

    def _name_matches(self, terms: list[str], candidates: dict[str, float]) -> list[str]:
        """The keys whose name terms all appear in ``terms``, by whichever way is cheaper."""
        if 1 << len(terms) <= len(candidates):
            # Few query terms, many candidates (a term such as "mcp" is in every name): look up each
            # subset of the query instead of testing every candidate.
            return [
                key
                for size in range(1, len(terms) + 1)
                for subset in itertools.combinations(terms, size)
                for key in self._name_sets.get(frozenset(subset), ())
            ]
        query = frozenset(terms)
        return [key for key in candidates if self._documents[key].name_set <= query]

    def _current_norms(self) -> dict[str, float]:
        if self._norms is None:
            # Only called with a matching term, so some document has a positive length.
            average = self._total_halves / len(self._documents)
            k1, b = self._k1, self._b
            self._norms = {key: k1 * (1 - b + b * doc.halves / average) for key, doc in self._documents.items()}
        return self._norms


def _discard(index: dict[_K, set[str]], entry: _K, key: str) -> None:
    keys = index[entry]
    keys.discard(key)
    if not keys:
        del index[entry]
