"""Shared helper of the test-harness stub modules (``torchvision``, ``sgl_kernel``).

These stubs are NOT part of the plugin. They exist only so that SGLang 0.5.23 imports on a CPU-only
test machine: PyPI's torchvision is a CUDA build whose import fails beside the CPU torch build
(``operator torchvision::nms does not exist``), and the ``sgl_kernel`` CPU extension is not on PyPI.
SGLang imports both at module level for code paths (multimodal preprocessing, CUDA/CPU kernels)
that a plain text model served with ``--device cpu --attention-backend torch_native`` never calls.
Any attribute resolves to a placeholder that raises if it is actually used.
"""

import enum


class InterpolationMode(enum.Enum):
    NEAREST = "nearest"
    NEAREST_EXACT = "nearest-exact"
    BILINEAR = "bilinear"
    BICUBIC = "bicubic"
    BOX = "box"
    HAMMING = "hamming"
    LANCZOS = "lanczos"


def placeholder(module_name: str, name: str):
    def _unavailable(*args, **kwargs):
        raise RuntimeError(
            f"{module_name}.{name} is a test-harness stub (tests/sglang_harness/stubs); "
            "install the real package to use this code path"
        )

    cls = type(name, (), {"__init__": _unavailable, "__call__": _unavailable, "__module__": module_name})
    return cls


def make_getattr(module_name: str):
    def __getattr__(name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        if name == "InterpolationMode":
            return InterpolationMode
        return placeholder(module_name, name)

    return __getattr__
