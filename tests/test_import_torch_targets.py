"""The torch importers' target declarations, their layering, and how failures inside a lowering surface.

Targets are declared at each lowering (``importers.torch.targets``); ``EMITTED_KINDS`` is checked
against what the lowerings actually emit on a corpus (the zoo, the op cases and a few extra
elementwise forms). A target declared by two lowerings is an error at import; the modules of
``importers/torch`` import each other without a cycle. A bug inside a lowering keeps its
traceback, with a note naming the fx node; arguments the lowering does not take are refused.
"""

from __future__ import annotations

import ast
import pathlib
import warnings

import pytest
import torch
import torch.nn as nn

import torchlean_bridge as tlb
from importers.torch import ops_reduce, targets
from importers.torch.program import EMITTED_KINDS
from importers.torch.targets import register
from torchlean_bridge.errors import UnsupportedError
from tests import test_import_torch_more_ops as more_ops
from tests.model_zoo import cases

warnings.filterwarnings("ignore", category=FutureWarning)

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "importers" / "torch"


class Extra(nn.Module):
    """Elementwise forms the zoo and the op cases do not use."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (torch.ceil(x), torch.floor(x), torch.expm1(x), torch.tan(x * 0.5), torch.sign(x),
                (x >= 0) | (x <= -1), torch.isnan(x).float(), torch.cumprod(x, 1), torch.linalg.det(x[:, :3]),
                nn.functional.grid_sample(x[None, None], x[:, :2][None, None], align_corners=False),
                nn.functional.fold(x[None], (2, 2), 1), *self.integer_forms((x * 10).long()))

    @staticmethod
    def integer_forms(i: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return torch.fmod(i, 3), i % 4, (i & 5) | 2, i ^ 1, ~i


def test_emitted_kinds_are_exactly_what_the_lowerings_emit():
    seen: set[str] = set()
    for case in cases("fx", slow=False):
        module, inputs = case.make()
        seen |= set(tlb.import_fx(module, inputs).graph.ops_used())
    for fn, x, vias, *inner in more_ops.CASES.values():
        module = more_ops.Fn(fn, *inner).eval()
        bundle = tlb.import_fx(module, (x,)) if "fx" in vias else tlb.import_export(module, (x,))
        seen |= set(bundle.graph.ops_used())
    seen |= set(tlb.import_fx(Extra().eval(), (torch.randn(3, 4),)).graph.ops_used())
    assert sorted(EMITTED_KINDS - seen) == [], "declared but never emitted"
    assert sorted(seen - EMITTED_KINDS) == [], "emitted but not declared"


def test_a_target_declared_by_two_lowerings_is_an_error():
    with pytest.raises(RuntimeError, match="declared by two lowerings"):
        register(lambda cx, input: input, aten="sum.default")
    assert targets.ATEN["aten.sum.default"] is ops_reduce.reduce_sum
    assert targets.aten_lowering(torch.ops.aten.sum.default) is ops_reduce.reduce_sum


def test_in_place_forms_lower_as_their_functional_form():
    assert targets.method_lowering("add_") is targets.method_lowering("add")
    assert targets.aten_lowering(torch.ops.aten.relu_.default) is targets.aten_lowering(torch.ops.aten.relu.default)
    assert targets.method_lowering("_private_") is None


def _local_imports(path: pathlib.Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level == 1 and node.module:
                out.add(node.module)
            elif node.level == 1:
                out.update(a.name for a in node.names)
            elif node.module and node.module.startswith("importers.torch."):
                out.add(node.module.split(".")[2])
    return out


def test_the_torch_importer_modules_import_each_other_without_a_cycle():
    graph = {p.stem: _local_imports(p) & {q.stem for q in PACKAGE.glob("*.py")} for p in PACKAGE.glob("*.py")}
    state: dict[str, int] = {}

    def visit(name: str, path: list[str]) -> None:
        if state.get(name) == 1:
            raise AssertionError("import cycle: " + " -> ".join(path + [name]))
        if state.get(name) == 2:
            return
        state[name] = 1
        for dep in sorted(graph[name]):
            visit(dep, path + [name])
        state[name] = 2

    for name in sorted(graph):
        visit(name, [])
    # the shared values and the lowerer know no dispatch table
    assert graph["common"] == set() and graph["lowerer"] == {"common"}


class SumOut(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sum(x, 1, out=None)


def test_arguments_a_lowering_does_not_take_are_refused_by_name():
    with pytest.raises(UnsupportedError, match=r"sum_1: torch\S*\.sum \(\S*test_import_torch_targets\.py:\d+\): cannot "
                                               r"lower these arguments \(TypeError: got an unexpected keyword "
                                               r"argument 'out'\)"):
        tlb.import_fx(SumOut().eval(), (torch.randn(2, 3),))


def test_a_bug_inside_a_lowering_keeps_its_traceback_with_the_node_named(monkeypatch):
    def broken(cx, input, *args, **kwargs):
        return {}["missing"]

    monkeypatch.setitem(targets.FUNCTIONS, torch.sum, broken)
    with pytest.raises(KeyError) as info:
        tlb.import_fx(SumOut().eval(), (torch.randn(2, 3),))
    assert any(note.startswith("While lowering fx node `sum_1` (torch") and "test_import_torch_targets.py" in note
               for note in info.value.__notes__)
    assert info.traceback[-1].name == "broken"
