"""F.interpolate's bicubic, antialiased and non-integer nearest modes through torch.fx and torch.export
(the ``resize`` op), against PyTorch in float64, and the forms refused with their reasons."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torchlean_bridge as tlb
from torchlean_bridge.errors import UnsupportedError

IMPORTERS = {"fx": tlb.import_fx, "export": tlb.import_export}


class Interp(nn.Module):
    def __init__(self, **kw) -> None:
        super().__init__()
        self.kw = kw

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.interpolate(x, **self.kw)


def _draw(rng):
    """Random bicubic / antialiased / nearest F.interpolate arguments on a random NCHW input."""
    shape = (int(rng.integers(1, 3)), int(rng.integers(1, 3)), int(rng.integers(1, 7)), int(rng.integers(1, 7)))
    mode = str(rng.choice(["bicubic", "bilinear", "nearest", "nearest-exact"]))
    kw = {"mode": mode}
    if mode in ("bicubic", "bilinear"):
        kw["antialias"] = bool(rng.random() < 0.6 or mode == "bilinear")
        if not kw["antialias"]:
            kw["align_corners"] = bool(rng.random() < 0.5)
    if rng.random() < 0.5:
        kw["size"] = (int(rng.integers(1, 10)), int(rng.integers(2, 10)))
    else:
        kw["scale_factor"] = (float(rng.choice([0.5, 0.75, 1.5, 2.5, 3.0])), float(rng.choice([0.6, 1.25, 2.0])))
        if any(int(np.floor(n * f)) == 0 for n, f in zip(shape[2:], kw["scale_factor"])) \
                or int(np.floor(shape[3] * kw["scale_factor"][1])) == 1:
            return None
    return shape, kw


@pytest.mark.parametrize("via", ["fx", "export"])
@pytest.mark.parametrize("seed", range(3))
def test_interpolate_modes_agree_with_pytorch(via, seed):
    """float64 within 1e-12 (bicubic and antialias) and exactly (nearest: the index tables are checked at
    import against PyTorch's float32 ones); a refused nearest table is refused with its reason."""
    rng = np.random.default_rng(seed)
    done = 0
    while done < 8:
        case = _draw(rng)
        if case is None:
            continue
        shape, kw = case
        x = torch.from_numpy(rng.normal(size=shape))
        want = F.interpolate(x, **kw).numpy()
        try:
            b = IMPORTERS[via](Interp(**kw).eval(), (x,))
        except UnsupportedError as e:
            assert kw["mode"].startswith("nearest") and "PyTorch's float32 source index differs" in str(e), str(e)
            continue
        got = np.asarray(tlb.evaluate(b.graph, b.payload, [x.numpy()], dtype="float64")[0])
        assert got.shape == want.shape, kw
        if kw["mode"].startswith("nearest"):
            np.testing.assert_array_equal(got, want, err_msg=str(kw))
        else:
            np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12, err_msg=str(kw))
        done += 1


def test_bicubic_is_one_resize_node_and_exports_to_onnx():
    x = torch.randn(1, 2, 4, 5, dtype=torch.float64)
    b = tlb.import_fx(Interp(size=(7, 3), mode="bicubic").eval(), (x,))
    assert [n.kind for n in b.graph.nodes] == ["input", "resize"]
    node = b.graph.nodes[1]
    assert (node.attrs["mode"], node.attrs["coordinate_mode"], node.attrs["cubic_coeff_a"]) == ("cubic", "half_pixel",
                                                                                                 -0.75)
    again = tlb.import_onnx(tlb.export_onnx(b))
    np.testing.assert_allclose(tlb.evaluate(again.graph, again.payload, [x.numpy()], dtype="float64")[0],
                               F.interpolate(x, size=(7, 3), mode="bicubic").numpy(), atol=1e-12)


@pytest.mark.parametrize("kw, reason, vias", [
    ({"size": (3, 1), "mode": "bilinear", "antialias": True}, "antialias=True to width 1 with a new height",
     ("fx", "export")),
    ({"size": (3, 2), "mode": "bicubic", "antialias": True, "align_corners": True},
     "antialias=True and align_corners=True", ("fx", "export")),
    ({"size": (3, 2), "mode": "area"}, "mode='area'", ("fx",)),  # (torch.export writes it as adaptive pooling)
])
def test_interpolate_forms_pytorch_computes_otherwise_are_refused(kw, reason, vias):
    x = torch.randn(1, 1, 5, 4, dtype=torch.float64)
    for via in vias:
        with pytest.raises(UnsupportedError, match=reason):
            IMPORTERS[via](Interp(**kw).eval(), (x,))
