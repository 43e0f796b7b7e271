"""Prompt groups: prompts so alike that one must never be trained on while its twin is scored.

ShareGPT holds the same question many times over (pasted twice, re-asked with a changed word,
the same long template with another last line). Removing duplicates by id keeps them all, and
because a request's sampling seed comes from its prompt, identical prompts even get identical
responses: a twin in train makes its test row an answer the predictor has seen. Two prompts join
one group when any of these holds (union-find, so the groups are the links' transitive closure):

- the same normalised text (NFKC, case-folded, whitespace collapsed);
- the same first ``PREFIX_CHARS`` normalised characters (one template, another tail);
- a word 3-gram Jaccard similarity of at least ``JACCARD_THRESHOLD`` (a reworded copy).

The Jaccard links are found exactly, without comparing all pairs, by prefix filtering
(Chaudhuri et al. 2006; Bayardo et al. 2007, "All-Pairs"): with each set's shingles ordered
rarest first, two sets whose Jaccard is at least t share a shingle among the first
``|x| - ceil(t |x|) + 1`` of either, so only those prefixes are indexed.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections import Counter, defaultdict
from typing import Dict, List, Sequence, Set, Tuple

# Normalised characters two prompts must share at their start to be one group: long enough that
# a shared greeting ("Hi, can you help me") is not a link, short enough that a template is.
PREFIX_CHARS = 200
# Word 3-gram Jaccard similarity at or above which two prompts are one group (the near-duplicate
# rule the label-set review used: reworded copies of one question score 0.5-0.9).
JACCARD_THRESHOLD = 0.5
# Shingle width in words; a prompt with fewer words is one shingle of all of them.
SHINGLE_WORDS = 3

_WORD = re.compile(r"\w+")


def normalise_text(text: str) -> str:
    return " ".join(unicodedata.normalize("NFKC", text).casefold().split())


def shingles(text: str) -> Set[str]:
    words = _WORD.findall(normalise_text(text))
    if len(words) < SHINGLE_WORDS:
        return {" ".join(words)}
    return {" ".join(words[i : i + SHINGLE_WORDS]) for i in range(len(words) - SHINGLE_WORDS + 1)}


def jaccard(a: Set[str], b: Set[str]) -> float:
    return len(a & b) / len(a | b) if a or b else 1.0


class _UnionFind:
    def __init__(self, size: int) -> None:
        self.parent = list(range(size))

    def find(self, index: int) -> int:
        while self.parent[index] != index:
            self.parent[index] = self.parent[self.parent[index]]
            index = self.parent[index]
        return index

    def union(self, a: int, b: int) -> None:
        root_a, root_b = self.find(a), self.find(b)
        if root_a != root_b:
            self.parent[max(root_a, root_b)] = min(root_a, root_b)  # the earliest member is the root


def similar_pairs(texts: Sequence[str], threshold: float = JACCARD_THRESHOLD) -> List[Tuple[int, int, float]]:
    """Every pair ``(i, j, jaccard)`` with ``i < j`` whose shingle Jaccard is at least ``threshold``."""
    assert 0.0 < threshold <= 1.0
    sets = [shingles(text) for text in texts]
    frequency = Counter(shingle for shingle_set in sets for shingle in shingle_set)
    ordered = [sorted(shingle_set, key=lambda s: (frequency[s], s)) for shingle_set in sets]
    index: Dict[str, List[int]] = defaultdict(list)
    pairs = []
    # Smaller sets first: a later set is at least as large, so the size filter reads |x| <= |y|.
    for j in sorted(range(len(sets)), key=lambda k: (len(sets[k]), k)):
        size = len(sets[j])
        prefix = size - math.ceil(threshold * size) + 1
        candidates = {i for shingle in ordered[j][:prefix] for i in index[shingle]}
        for i in candidates:
            if len(sets[i]) >= threshold * size:
                score = jaccard(sets[i], sets[j])
                if score >= threshold:
                    pairs.append((min(i, j), max(i, j), score))
        for shingle in ordered[j][:prefix]:
            index[shingle].append(j)
    return sorted(pairs)


def prompt_groups(texts: Sequence[str]) -> List[int]:
    """Each text's group: the position of the group's first text, so singletons are their own index."""
    links = _UnionFind(len(texts))
    for key_of in (normalise_text, lambda text: normalise_text(text)[:PREFIX_CHARS]):
        first: Dict[str, int] = {}
        for position, text in enumerate(texts):
            links.union(first.setdefault(key_of(text), position), position)
    for i, j, _ in similar_pairs(texts):
        links.union(i, j)
    return [links.find(position) for position in range(len(texts))]


def group_sizes(groups: Sequence[int]) -> Dict[str, int]:
    """How many groups and rows the grouping made, for a summary."""
    sizes = Counter(groups)
    return {"rows": len(groups), "groups": len(sizes),
            "multi_row_groups": sum(1 for size in sizes.values() if size > 1),
            "rows_in_multi_row_groups": sum(size for size in sizes.values() if size > 1)}  # fmt: skip


def check_split_groups(splits: Dict[str, Sequence[Tuple[str, str]]]) -> None:
    """Refuse splits (name -> ``(id, text)`` rows) between which a prompt group straddles, naming two ids."""
    from specforge_outlets.errors import OutletsError

    rows = [(name, row_id, text) for name, split in splits.items() for row_id, text in split]
    groups = prompt_groups([text for _, _, text in rows])
    first_of_group: Dict[int, Tuple[str, str]] = {}
    for (name, row_id, _), group in zip(rows, groups):
        other = first_of_group.setdefault(group, (name, row_id))
        if other[0] != name:
            raise OutletsError(
                f"{other[0]} id {other[1]} and {name} id {row_id} are one prompt group (the same or a "
                "near-duplicate prompt: data/prompt_groups.py), so a predictor would be scored on a prompt "
                "it was trained on; put them in one split, or let `outlets prepare` split by group"
            )
