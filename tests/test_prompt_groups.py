"""Prompt groups: twins and near-duplicates found exactly, kept in one split, refused across splits."""

import itertools
import random

import pytest

from specforge_outlets.data.prompt_groups import (
    check_split_groups, group_sizes, jaccard, prompt_groups, shingles, similar_pairs)
from specforge_outlets.data.split import split_rows
from specforge_outlets.errors import OutletsError

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma".split()


def _random_texts(count, seed):
    rng = random.Random(seed)
    texts = []
    for _ in range(count):
        if texts and rng.random() < 0.3:  # a reworded copy of an earlier text
            words = rng.choice(texts).split()
            words[rng.randrange(len(words))] = rng.choice(WORDS)
            texts.append(" ".join(words))
        else:
            texts.append(" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 12))))
    return texts


@pytest.mark.parametrize("threshold", [0.3, 0.5, 0.8])
def test_prefix_filtering_finds_exactly_the_pairs_all_pairs_finds(threshold):
    texts = _random_texts(160, seed=int(threshold * 10))
    sets = [shingles(text) for text in texts]
    brute = {(i, j) for i, j in itertools.combinations(range(len(texts)), 2) if jaccard(sets[i], sets[j]) >= threshold}
    assert brute  # the reworded copies make pairs at every threshold
    assert {(i, j) for i, j, _ in similar_pairs(texts, threshold)} == brute


def test_each_rule_links_a_group_and_links_are_transitive():
    template = "Act as an expert reviewer. " * 10  # over 200 characters shared
    texts = [
        "Explain quantum computing in simple terms",
        "explain   QUANTUM computing in simple terms",  # same normalised text
        template + "Review my essay on dogs.",
        template + "Review my poem about cats, please.",  # same first 200 normalised characters
        "how do I sort a list of numbers in python quickly and without extra memory",
        "how do I sort a list of numbers in python quickly and with little extra memory",  # Jaccard >= 0.5
        "please tell me how do I sort a list of numbers in python quickly and with little extra memory used",
        "an unrelated question about the weather",
    ]
    groups = prompt_groups(texts)
    assert groups == [0, 0, 2, 2, 4, 4, 4, 7]
    assert group_sizes(groups) == {"rows": 8, "groups": 4, "multi_row_groups": 3, "rows_in_multi_row_groups": 7}


def test_split_by_group_never_straddles_and_moves_only_straddling_groups():
    texts = _random_texts(300, seed=3)
    groups = prompt_groups(texts)
    rows = list(range(len(texts)))
    train, test = split_rows(rows, seed=0, groups=groups)
    test_groups, train_groups = {groups[i] for i in test}, {groups[i] for i in train}
    assert test_groups.isdisjoint(train_groups) and sorted(train + test) == rows
    plain_test = set(split_rows(rows, seed=0)[1])
    singletons = [i for i in rows if groups.count(groups[i]) == 1]
    assert all((i in test) == (i in plain_test) for i in singletons)
    assert set(test) != plain_test  # some group straddled the plain split and was pulled to one side


def test_a_hand_made_split_with_a_straddling_group_is_refused_naming_both_ids():
    train = [("a", "What is the capital of France?"), ("b", "Write a poem about the sea")]
    test = [("c", "Tell me a joke"), ("d", "what is the capital of  france?")]
    with pytest.raises(OutletsError, match="train id a and test id d are one prompt group"):
        check_split_groups({"train": train, "test": test})
    check_split_groups({"train": train, "test": test[:1]})
