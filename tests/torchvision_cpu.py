"""torchvision with the CPU build of torch.

The torchvision wheel built for this torch is a CUDA build whose compiled extension does not load
with the CPU torch, and torchvision's import registers fake kernels for ``torchvision::nms`` and
``torchvision::qnms``, which then do not exist. Defining those two operators schema-only (no kernel:
detection post-processing is never run here) is enough for the model code; transformers imports
torchvision when it is installed, so the test modules that build transformers models call this too.
"""

from __future__ import annotations

import importlib.util
import pathlib

import torch

__all__ = ["define_missing_ops", "import_torchvision"]

_LIBRARY: torch.library.Library | None = None


def define_missing_ops() -> None:
    """Define ``torchvision::nms``/``qnms`` (schemas only) unless torchvision's extension loads here."""
    global _LIBRARY
    spec = importlib.util.find_spec("torchvision")
    if _LIBRARY is not None or spec is None or _extension_loads(spec):
        return
    _LIBRARY = torch.library.Library("torchvision", "DEF")
    _LIBRARY.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    _LIBRARY.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")


def _extension_loads(spec) -> bool:
    """A torchvision build matching this torch (its ``_C`` library loads and defines the ops itself)."""
    try:
        torch.ops.torchvision.nms  # noqa: B018 - already defined (loaded, or by an earlier call)
        return True
    except (AttributeError, RuntimeError):
        pass
    folder = pathlib.Path(spec.origin).parent
    for library in sorted(folder.glob("_C*.so")) + sorted(folder.glob("_C*.pyd")):
        try:
            torch.ops.load_library(str(library))
            return True
        except (OSError, RuntimeError):
            continue
    return False


def import_torchvision():
    """torchvision (after ``define_missing_ops``), or None when it is not installed."""
    if importlib.util.find_spec("torchvision") is None:
        return None
    define_missing_ops()
    import torchvision
    return torchvision
