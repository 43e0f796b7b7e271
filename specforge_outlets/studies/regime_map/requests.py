"""Which of the workload's samples a run's requests are, and the prompts a batch's prediction pass prefills.

- ``uniform``: samples drawn uniformly with replacement (the ladder's draw); each request stands for its own
  prompt, so a batch's pass prefills every request's prompt.
- ``prompt groups`` (data regeneration, RL rollouts): every sample of the drawn prompts, a prompt's samples
  submitted together, the prompts in the seed's order. r̂₀ reads the prompt alone, so a prompt's samples share it
  (the label set's learned rungs give one value per prompt), and the pass prefills each distinct prompt once.
"""

from __future__ import annotations

from typing import Callable, Dict, Tuple

import numpy as np


def uniform(rng: np.random.Generator, work, count: int) -> np.ndarray:
    return rng.integers(0, len(work.ids), size=count)


def prompt_groups(rng: np.random.Generator, work, count: int) -> np.ndarray:
    """Every sample of ``count`` / (samples per prompt) prompts drawn without replacement."""
    prompts, per_prompt = np.unique(work.prompts, return_counts=True)
    if len(set(per_prompt)) != 1 or count % per_prompt[0] or count // per_prompt[0] > len(prompts):
        raise ValueError(f"shape {count}: a prompt-groups batch takes a multiple of the samples per prompt "
                         f"({sorted(set(per_prompt.tolist()))}) up to the workload's {len(work.ids)} samples")
    chosen = rng.permutation(prompts)[:count // per_prompt[0]]
    return np.concatenate([np.flatnonzero(work.prompts == prompt) for prompt in chosen])


def every_request_prompt(work, drawn: np.ndarray) -> np.ndarray:
    return work.input_lens[drawn]


def distinct_prompts(work, drawn: np.ndarray) -> np.ndarray:
    """The input length of each distinct prompt among the drawn samples, once."""
    _, first = np.unique(work.prompts[drawn], return_index=True)
    return work.input_lens[drawn[first]]


Draw = Callable[[np.random.Generator, object, int], np.ndarray]
PassPrompts = Callable[[object, np.ndarray], np.ndarray]
# name -> (draw(generator, workload, count) -> sample indices, the input lengths a prediction pass prefills)
DRAWS: Dict[str, Tuple[Draw, PassPrompts]] = {
    "uniform": (uniform, every_request_prompt),
    "prompt groups": (prompt_groups, distinct_prompts),
}
