"""The affine base grid both importers build for AffineGrid / F.affine_grid (a constant of the graph)."""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

__all__ = ["affine_base_grid"]


def affine_base_grid(spatial: Sequence[int], align_corners: bool) -> np.ndarray:
    """[prod(spatial), r + 1]: each cell's normalized (x, y[, z]) (last axis first) and a 1, cells row-major.

    Along an axis of n cells the coordinates are -1 + 2i/(n - 1) (align_corners) or (2i + 1)/n - 1; a single
    cell sits at 0 (PyTorch's rule; the ONNX importer refuses n = 1 with align_corners, which the spec leaves
    undefined)."""
    axes = []
    for n in spatial:
        i = np.arange(n, dtype=np.float64)
        if n == 1:
            axes.append(np.zeros(1))
        elif align_corners:
            axes.append(-1 + 2 * i / (n - 1))
        else:
            axes.append((2 * i + 1) / n - 1)
    mesh = np.meshgrid(*axes, indexing="ij")
    columns = [m.reshape(-1) for m in reversed(mesh)] + [np.ones(math.prod(spatial))]
    return np.stack(columns, axis=1)
