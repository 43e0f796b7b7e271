"""A progress line in the training log of a batch job (stderr not a terminal).

SpecForge's trainer draws its tqdm bar only on an interactive terminal
(``TrainerController._make_progress_bar``) and otherwise prints, every ``training.log_interval``
steps, the raw metric dict: a batch job's log says neither how fast the run goes nor when it ends.
``install_progress_line`` makes rank 0 print, at those same steps, one line on stderr::

    outlets train: step 40/400 (10%) loss 3.1416 | 1,234 tokens/s | elapsed 0:01:23, ETA 0:12:30

``loss`` is the run's total loss (``total_loss``: drafting and length terms; SpecForge's ``loss``
otherwise); ``tokens/s`` counts the tokens of the batches trained on since the previous line (the
attention mask's, else every position of ``input_ids``) on rank 0, times the data-parallel ranks;
the ETA is the remaining steps at the mean step time so far. On a terminal SpecForge's bar stays.
"""

from __future__ import annotations

import sys
import time
from datetime import timedelta
from typing import Any, Callable, Iterable, Mapping, Optional, TextIO


def batch_tokens(batch: Any) -> int:
    """Tokens in one TrainBatch: its attention mask's, else the size of its input_ids (0 if neither)."""
    tensors = getattr(batch, "tensors", {}) or {}
    mask = tensors.get("attention_mask")
    if mask is not None:
        return int(mask.sum())
    ids = tensors.get("input_ids")
    return int(ids.numel()) if ids is not None else 0


class ProgressLine:
    """The trainer's logger, wrapped: forwards every call, then prints the progress line."""

    def __init__(self, logger: Optional[Callable], total_steps: Optional[int], start_step: int, ranks: int = 1,
                 stream: TextIO = sys.stderr, clock: Callable[[], float] = time.perf_counter) -> None:
        self.logger, self.total_steps, self.start_step, self.ranks = logger, total_steps, start_step, ranks
        self.stream, self.clock = stream, clock
        self.started = self.window_started = clock()
        self.tokens = 0

    def counted(self, data: Iterable) -> "CountedData":
        return CountedData(data, self)

    def __call__(self, metrics: Mapping[str, Any], step: int) -> None:
        if self.logger is not None:
            self.logger(metrics, step)
        loss = metrics.get("total_loss", metrics.get("loss"))
        if loss is None:  # the evaluator's metrics: no training step to report
            return
        now = self.clock()
        rate = self.tokens * self.ranks / max(now - self.window_started, 1e-9)
        self.tokens, self.window_started = 0, now
        elapsed = now - self.started
        done = max(step - self.start_step, 1)
        if self.total_steps:
            position = f"step {step}/{self.total_steps} ({100 * step / self.total_steps:.0f}%)"
            eta = f", ETA {_clock(elapsed / done * max(self.total_steps - step, 0))}"
        else:
            position, eta = f"step {step}", ""
        print(f"outlets train: {position} loss {float(loss):.4f} | {rate:,.0f} tokens/s | elapsed {_clock(elapsed)}{eta}",
              file=self.stream, flush=True)

    def __getattr__(self, name: str) -> Any:  # close() and the rest of a tracker logger
        return getattr(self.logger, name)


class CountedData:
    """The trainer's data, unchanged, counting each batch's tokens into the progress line as it is read."""

    def __init__(self, data: Iterable, line: ProgressLine) -> None:
        self.data, self.line = data, line

    def __iter__(self):
        for batch in self.data:
            self.line.tokens += batch_tokens(batch)
            yield batch

    def __len__(self) -> int:
        return len(self.data)

    def __getattr__(self, name: str) -> Any:  # set_epoch, seek, ...
        return getattr(self.data, name)


def _clock(seconds: float) -> str:
    return str(timedelta(seconds=round(seconds)))


def install_progress_line(stream: TextIO = sys.stderr) -> None:
    """Print the progress line from SpecForge's trainer on rank 0 when ``stream`` is not a terminal."""
    if stream.isatty():
        return
    import torch.distributed as dist
    from specforge.training.controller import TrainerController

    fit = TrainerController.fit

    def fit_with_progress(self, data):
        distributed = dist.is_available() and dist.is_initialized()
        if distributed and dist.get_rank() != 0:
            return fit(self, data)
        total = self.max_steps if self.max_steps is not None else self.total_steps
        line = ProgressLine(self.logger, total, self.global_step, dist.get_world_size() if distributed else 1, stream)
        self.logger = line
        return fit(self, line.counted(data))

    TrainerController.fit = fit_with_progress
