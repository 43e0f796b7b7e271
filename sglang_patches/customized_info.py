"""What the scheduler reports of a request's prediction: values in its ``customized_info``, by output token.

The tokenizer process's ``meta_info`` hook (``meta_info.py``) turns each into its latest value.
"""

from __future__ import annotations


def report(req, key: str, value, at_output: int = 0) -> None:
    """``value`` under ``key`` in the request's ``customized_info``, at output token ``at_output``.

    SGLang slices each ``customized_info`` list by output token when it streams (a chunk carries
    the entries of its own tokens), so a value is put at the token it belongs to: r̂_0 at the first
    (sent with it, or at the end without streaming), r̂_t at the token it was read at. The meta_info
    hook (``meta_info.py``) reports the latest value of each key."""
    info = getattr(req, "customized_info", None)
    if info is None:
        info = {}
        try:
            req.customized_info = info
        except AttributeError:
            return
    # only the latest value is kept (earlier ones were streamed with their tokens already)
    info[key] = TokenAlignedValue(at_output, _reported(value))


def _reported(value):
    """A value as ``meta_info`` shows it: integers as they are, floats to 3 decimals, quantiles as a list of those."""
    if isinstance(value, (list, tuple)):
        return [round(float(item), 3) for item in value]
    return value if isinstance(value, int) else round(float(value), 3)


class TokenAlignedValue:
    """A per-token list that holds one value, at output token ``index``, without materialising the rest.

    SGLang reads a ``customized_info`` entry by slicing it with output-token offsets; a real list
    would cost one entry per output token every time an estimate is made. A slice is built only for
    the tokens it covers (the tokens of one streamed chunk, or all of them once at the end)."""

    __slots__ = ("index", "value")

    def __init__(self, index: int, value) -> None:
        self.index, self.value = index, value

    def __len__(self) -> int:
        return self.index + 1

    def __getitem__(self, item):
        if isinstance(item, slice):
            start, stop, step = item.indices(len(self))
            return [self.value if position == self.index else None for position in range(start, stop, step)]
        position = item + len(self) if item < 0 else item
        if not 0 <= position < len(self):
            raise IndexError(item)
        return self.value if position == self.index else None

    def __iter__(self):
        return iter(self[:])

    def __eq__(self, other) -> bool:
        return list(self) == list(other)

    def __repr__(self) -> str:
        return f"TokenAlignedValue({self.index}, {self.value!r})"
