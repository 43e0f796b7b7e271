"""The training progress line's arithmetic, on a fake clock (the real run: tests/test_train_command.py)."""

import io
from types import SimpleNamespace

import torch

from specforge_outlets.training.progress import ProgressLine, batch_tokens


def test_tokens_per_second_eta_and_the_forwarded_logger():
    now = [100.0]
    forwarded = []
    stream = io.StringIO()
    line = ProgressLine(lambda metrics, step: forwarded.append(step), total_steps=10, start_step=0, ranks=2,
                        stream=stream, clock=lambda: now[0])
    batches = [SimpleNamespace(tensors={"input_ids": torch.ones(2, 8), "attention_mask": torch.tensor([[1] * 8, [1] * 4 + [0] * 4])}),
               SimpleNamespace(tensors={"input_ids": torch.ones(1, 5)})]
    assert [batch_tokens(batch) for batch in batches] == [12, 5]
    assert list(line.counted(batches)) == batches
    now[0] = 110.0
    line({"total_loss": torch.tensor(2.5), "loss": 9.0}, 2)
    line({"eval/loss": 1.0}, 2)  # the evaluator's metrics: forwarded, no line
    assert forwarded == [2, 2]
    # 17 tokens on rank 0 over 10 s, two ranks; 2 of 10 steps in 10 s: 40 s to go
    assert stream.getvalue() == ("outlets train: step 2/10 (20%) loss 2.5000 | 3 tokens/s | "
                                 "elapsed 0:00:10, ETA 0:00:40\n")
