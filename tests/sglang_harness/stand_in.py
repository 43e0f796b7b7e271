"""A stand-in for SGLang's ``Req`` in in-process tests of the plugin."""

from types import SimpleNamespace


class StandInReq(SimpleNamespace):
    """A stand-in ``Req``: hashed and compared by identity, as SGLang's is (the order keeps keys by request)."""

    __hash__ = object.__hash__
    __eq__ = object.__eq__
