"""Test-harness stub, not part of the plugin: see tests/sglang_harness/stubs/_harness_stub.py."""

from _harness_stub import make_getattr

__getattr__ = make_getattr(__name__)
