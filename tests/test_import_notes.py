"""Import reports say where the IR's TorchLean semantics differ from the framework's, and keep
every note (an opset upgrade's and the builder's together)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import torchlean_bridge as tlb

torch = pytest.importorskip("torch")


def _onnx_sqrt(opset: int = 17, shape=(3,)):
    g = helper.make_graph([helper.make_node("Sqrt", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.DOUBLE, list(shape))],
                          [helper.make_tensor_value_info("y", TensorProto.DOUBLE, list(shape))])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def test_an_onnx_sqrt_is_said_to_differ_on_negative_arguments():
    b = tlb.import_onnx(_onnx_sqrt())
    assert b.report["notes"] == ["sqrt (node 1): TorchLean's sqrt is sqrt(max(x, 0)), so a negative argument "
                                 "gives 0 where onnx gives NaN; the values agree wherever the argument is >= 0"]
    np.testing.assert_array_equal(tlb.evaluate(b.graph, b.payload, np.array([-1.0, 4.0, 0.0]))[0], [0.0, 2.0, 0.0])


@pytest.mark.parametrize("importer", ["import_fx", "import_export"])
def test_a_torch_sqrt_is_said_to_differ_on_negative_arguments(importer):
    class Roots(torch.nn.Module):
        def forward(self, x):
            return torch.sqrt(x) + torch.sqrt(x + 1)

    b = getattr(tlb, importer)(Roots().eval(), (torch.tensor([1.0, 4.0, 9.0]),))
    assert b.report["notes"] == ["sqrt (nodes 1, 5): TorchLean's sqrt is sqrt(max(x, 0)), so a negative argument "
                                 "gives 0 where torch gives NaN; the values agree wherever the argument is >= 0"]


def test_a_graph_without_sqrt_has_no_such_note():
    class Plain(torch.nn.Module):
        def forward(self, x):
            return torch.relu(x)

    assert "notes" not in tlb.import_fx(Plain().eval(), (torch.zeros(3),)).report


def test_the_importer_notes_and_the_semantic_note_are_both_kept():
    """A symbolic batch axis is noted by the ONNX importer, the sqrt by the builder: both stay."""
    notes = tlb.import_onnx(_onnx_sqrt(shape=("N", 3))).report["notes"]
    assert len(notes) == 2 and "batch" in notes[0] and notes[1].startswith("sqrt (node 1)")
