"""torchvision with the CPU build of torch.

The torchvision wheel built for this torch is a CUDA build whose compiled extension does not load
with the CPU torch, and torchvision's import registers fake kernels for ``torchvision::nms`` and
``torchvision::qnms``, which then do not exist. Defining those two operators schema-only (no kernel:
detection post-processing is never run here) is enough for the model code; transformers imports
torchvision when it is installed, so the test modules that build transformers models call this too.
"""

from __future__ import annotations

import importlib.util

import torch

__all__ = ["define_missing_ops", "import_torchvision"]

_LIBRARY: torch.library.Library | None = None


def define_missing_ops() -> None:
    """Define ``torchvision::nms``/``qnms`` (schemas only) unless torchvision's extension did."""
    global _LIBRARY
    if _LIBRARY is not None or importlib.util.find_spec("torchvision") is None:
        return
    try:
        torch.ops.torchvision.nms  # noqa: B018 - defined by a loadable extension
        return
    except (AttributeError, RuntimeError):
        pass
    _LIBRARY = torch.library.Library("torchvision", "DEF")
    _LIBRARY.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    _LIBRARY.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")


def import_torchvision():
    """torchvision (after ``define_missing_ops``), or None when it is not installed."""
    if importlib.util.find_spec("torchvision") is None:
        return None
    define_missing_ops()
    import torchvision
    return torchvision
