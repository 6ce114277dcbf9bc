"""Result shapes of the generators issue #15 folds (the windows, MelWeightMatrix), computed from their
input values so that ``fold.check_fold_size`` refuses an oversized fold before it allocates."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

__all__ = ["GENERATED_SHAPES"]


def _scalar_int(feeds: dict[str, np.ndarray], node: Any, i: int) -> int | None:
    if len(node.input) <= i or not node.input[i] or node.input[i] not in feeds:
        return None
    v = np.asarray(feeds[node.input[i]]).reshape(-1)
    return int(v[0]) if v.size == 1 else None


def _window_shape(node: Any, feeds: dict[str, np.ndarray]) -> tuple[int, ...] | None:
    n = _scalar_int(feeds, node, 0)
    return None if n is None else (n,)


def _mel_shape(node: Any, feeds: dict[str, np.ndarray]) -> tuple[int, ...] | None:
    bins, dft = _scalar_int(feeds, node, 0), _scalar_int(feeds, node, 1)
    return None if bins is None or dft is None else (dft // 2 + 1, bins)


GENERATED_SHAPES: dict[str, Callable[[Any, dict[str, np.ndarray]], tuple[int, ...] | None]] = {
    "HannWindow": _window_shape, "HammingWindow": _window_shape, "BlackmanWindow": _window_shape,
    "MelWeightMatrix": _mel_shape,
}
