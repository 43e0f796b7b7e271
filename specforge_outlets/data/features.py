"""The offline feature file: SpecForge's ``.ckpt`` layout plus ``remaining_length``.

One file per conversation, a ``torch.save`` dict that SpecForge's offline reader takes as is:

    input_ids         [T]         int64   tokenised conversation
    loss_mask         [T]         int64   1 on assistant tokens
    hidden_state      [1, T, H]           target's last hidden state (after the final norm)
    aux_hidden_state  [1, T, 3H]          target's three fusion depths, concatenated low..high
    remaining_length  [T]         int64   L - t on response tokens, NO_LABEL elsewhere
    remaining_lower_bound [T]     int64   c - t on censored response tokens, NO_LABEL elsewhere
                                          (optional: files captured before it have none)

Files are written to a temporary name and renamed, so a crash never leaves a truncated file
that looks finished. A ``.ckpt.gz`` (SpecForge's ``prepare_hidden_states.py --compress``) is the
same dict gzip-compressed; it is read and written back compressed.
"""

from __future__ import annotations

import gzip
import io
import os
from typing import Dict, Optional

import torch

from specforge_outlets.data.labels import NO_LABEL
from specforge_outlets.errors import OutletsError

FEATURE_SUFFIX = ".ckpt"
COMPRESSED_SUFFIX = ".ckpt.gz"
SPECFORGE_KEYS = ("input_ids", "loss_mask", "hidden_state", "aux_hidden_state")
LENGTH_KEY = "remaining_length"
LOWER_BOUND_KEY = "remaining_lower_bound"
FEATURE_KEYS = (*SPECFORGE_KEYS, LENGTH_KEY)
OPTIONAL_KEYS = (LOWER_BOUND_KEY,)


class FeatureFileError(OutletsError):
    """A feature file that training or evaluation cannot use, with the fix in the message."""


def save_features(path: str, features: Dict[str, torch.Tensor]) -> None:
    """Validate and atomically write one feature file."""
    validate_features(features, source=path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    keys = (*FEATURE_KEYS, *(key for key in OPTIONAL_KEYS if key in features))
    data = {key: features[key].contiguous() for key in keys}
    if path.endswith(COMPRESSED_SUFFIX):
        with gzip.open(tmp, "wb") as handle:
            torch.save(data, handle)
    else:
        torch.save(data, tmp)
    os.replace(tmp, path)


def read_feature_file(path: str) -> Dict[str, torch.Tensor]:
    """The dict of a ``.ckpt``, or of a ``.ckpt.gz`` (decompressed whole: torch.load needs to seek)."""
    if path.endswith(COMPRESSED_SUFFIX):
        with gzip.open(path, "rb") as handle:
            return torch.load(io.BytesIO(handle.read()), map_location="cpu", weights_only=True)
    return torch.load(path, map_location="cpu", weights_only=True)


def load_features(path: str, hidden_size: Optional[int] = None) -> Dict[str, torch.Tensor]:
    """Load and validate one feature file."""
    try:
        features = read_feature_file(path)
    except Exception as exc:  # corrupt or foreign file: name it
        raise FeatureFileError(f"{path}: not a readable feature file ({exc})") from exc
    validate_features(features, source=path, hidden_size=hidden_size)
    return features


def validate_features(
    features: Dict[str, torch.Tensor], *, source: str, hidden_size: Optional[int] = None
) -> None:
    """Check keys, shapes and label sanity; the error names the file, the field and the fix."""
    if not isinstance(features, dict):
        raise FeatureFileError(f"{source}: expected a dict of tensors, got {type(features).__name__}")
    missing = [key for key in FEATURE_KEYS if key not in features]
    if LENGTH_KEY in missing:
        raise FeatureFileError(
            f"{source}: no '{LENGTH_KEY}' tensor. OUTLETS needs length labels: write features "
            "with `outlets capture`, or add labels to SpecForge-captured files with "
            "`outlets capture --add-labels`"
        )
    if missing:
        raise FeatureFileError(f"{source}: missing feature keys {missing}; re-run `outlets capture`")
    input_ids, loss_mask = features["input_ids"], features["loss_mask"]
    labels, hidden, aux = features[LENGTH_KEY], features["hidden_state"], features["aux_hidden_state"]
    if input_ids.dim() != 1:
        raise FeatureFileError(f"{source}: input_ids must be [T], got {tuple(input_ids.shape)}")
    seq_len = input_ids.shape[0]
    for key, tensor in (("loss_mask", loss_mask), (LENGTH_KEY, labels)):
        if tuple(tensor.shape) != (seq_len,):
            raise FeatureFileError(
                f"{source}: {key} must be [T]=[{seq_len}] like input_ids, got {tuple(tensor.shape)}"
            )
    if hidden.dim() != 3 or hidden.shape[:2] != (1, seq_len):
        raise FeatureFileError(f"{source}: hidden_state must be [1, {seq_len}, H], got {tuple(hidden.shape)}")
    if tuple(aux.shape) != (1, seq_len, 3 * hidden.shape[-1]):
        raise FeatureFileError(
            f"{source}: aux_hidden_state must be [1, {seq_len}, 3H={3 * hidden.shape[-1]}] "
            f"(three fusion depths), got {tuple(aux.shape)}"
        )
    if hidden_size is not None and hidden.shape[-1] != hidden_size:
        raise FeatureFileError(
            f"{source}: hidden size {hidden.shape[-1]} does not match the target's {hidden_size}; "
            "these features were captured from another target model"
        )
    bad = (labels != NO_LABEL) & ((labels < 1) | (loss_mask == 0))
    if bool(bad.any()):
        position = int(torch.nonzero(bad)[0])
        raise FeatureFileError(
            f"{source}: {LENGTH_KEY}[{position}]={int(labels[position])} is not a valid label "
            f"(labels are >= 1 and only on loss-mask positions; {NO_LABEL} marks no label)"
        )
    bounds = features.get(LOWER_BOUND_KEY)
    if bounds is not None:
        if tuple(bounds.shape) != (seq_len,):
            raise FeatureFileError(f"{source}: {LOWER_BOUND_KEY} must be [T]=[{seq_len}], got {tuple(bounds.shape)}")
        bad = (bounds != NO_LABEL) & ((bounds < 1) | (loss_mask == 0) | (labels != NO_LABEL))
        if bool(bad.any()):
            position = int(torch.nonzero(bad)[0])
            raise FeatureFileError(
                f"{source}: {LOWER_BOUND_KEY}[{position}]={int(bounds[position])} is not a valid bound "
                f"(>= 1, only on loss-mask positions without a {LENGTH_KEY} label); re-run `outlets capture`"
            )
