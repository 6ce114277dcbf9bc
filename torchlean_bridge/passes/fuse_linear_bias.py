"""``x @ W + b`` as one ``linear`` node, whichever importer produced it.

Frameworks often spell a dense layer as a product and a separate bias add: torch's ``x @ W.t() + b``
(fx/export) and ONNX's ``MatMul`` then ``Add``. TorchLean's ``linear`` (weight [out, in], bias [out])
is the same computation as one node with both tensors as parameters, so the ABI, audits, the v1
writer and the bound propagators see a layer, not an anonymous product. Importers emit what they
read (``matmul`` by a constant matrix, or a bias-free ``linear`` for ONNX MatMul by an initializer);
this pass fuses an ``add`` whose other operand is a constant holding one value per output column
(shape ``[..., 1, n]``), when the product has no other reader. The bias tensor keeps its binding,
moved to the linear's ``bias`` role (its transform gains the reshape to ``[n]``), and the weight's
binding gains the transpose a ``matmul`` by ``W`` [in, out] needs. Exact: ``linear`` computes
``x @ W.T + b`` with the same operations.
"""

from __future__ import annotations

__all__ = ["fuse_linear_bias"]

from dataclasses import replace

import numpy as np

from ..bundle import Bundle
from ..graph import Node
from ..ops import FLOAT
from ..roles import Binding, Step, Transform
from .base import GraphEdit, Note
from .dead_code import eliminate_dead_code


class _Fuser:
    def __init__(self, bundle: Bundle) -> None:
        self.bundle = bundle
        self.g = bundle.graph
        self.consumers = self.g.consumers()
        self.outputs = set(self.g.outputs)
        self.edit = GraphEdit(bundle)
        self.details: list[str] = []

    def run(self) -> tuple[Bundle, Note]:
        for node in self.g.nodes:
            if node.kind != "add" or not self._fuse(node):
                self.edit.keep(node)
        if not self.details:
            return self.bundle, Note("fuse_linear_bias")
        out, _ = eliminate_dead_code(self.edit.result())
        return out, Note("fuse_linear_bias", len(self.details), tuple(self.details))

    # -- matching ---------------------------------------------------------------------------------
    def _bias_const(self, nid: int, n: int, rank: int) -> Node | None:
        """The constant behind operand ``nid`` when it holds one float per output column."""
        node = self.g.nodes[nid]
        if node.kind == "broadcast_to":
            node = self.g.nodes[node.parents[0]]
        if node.kind != "const" or node.dtype != FLOAT:
            return None
        v = self.bundle.payload.get(node.id, "values")
        if v is None or v.dtype.kind != "f" or v.ndim < 1 or v.ndim > rank or v.shape[-1] != n or v.size != n:
            return None
        return node

    def _product(self, nid: int) -> str | None:
        """``"linear"`` for a bias-free linear, ``"matmul"`` for a product by a constant matrix."""
        node = self.g.nodes[nid]
        if len(self.consumers[nid]) != 1 or nid in self.outputs:
            return None
        if node.kind == "linear":
            bias = self.bundle.payload.get(nid, "bias")
            bound = any(b.node == nid and b.role == "bias" for b in self.bundle.roles.bindings())
            return "linear" if bias is not None and not bound and not np.any(bias) else None
        if node.kind == "matmul":
            x, w = (self.g.nodes[p] for p in node.parents)
            wv = self.bundle.payload.get(w.id, "values") if w.kind == "const" else None
            if wv is not None and wv.ndim == 2 and wv.dtype.kind == "f" and len(x.out_shape) >= 1:
                return "matmul"
        return None

    def _fuse(self, add: Node) -> bool:
        for pi, bi in ((0, 1), (1, 0)):
            product_id = add.parents[pi]
            form = self._product(product_id)
            bias = form and self._bias_const(add.parents[bi], add.out_shape[-1] if add.out_shape else -1,
                                             len(add.out_shape))
            if bias is not None and self.g.nodes[product_id].out_shape == add.out_shape:
                self._emit(add, self.g.nodes[product_id], form, bias)
                return True
        return False

    # -- rewriting --------------------------------------------------------------------------------
    def _emit(self, add: Node, product: Node, form: str, bias: Node) -> None:
        edit, payload = self.edit, self.bundle.payload
        n = add.out_shape[-1]
        if form == "linear":  # keep the layer's own provenance, now producing the add's tensor
            source = replace(product.source, tensor=add.source.tensor) if product.source and add.source \
                else add.source
            nid = edit.emit("linear", edit.parents(product), product.attrs, add.out_shape, add.dtype, source)
            edit.payload[nid] = {"weight": payload.get(product.id, "weight")}
            edit.bindings.extend(Binding(b.key, nid, b.role, b.transform)
                                 for b in self.bundle.roles.for_node(product.id) if b.role == "weight")
        else:
            x, w = product.parents
            nid = edit.emit("linear", (edit.new_id[x],), {}, add.out_shape, add.dtype, add.source)
            edit.payload[nid] = {"weight": np.ascontiguousarray(payload.get(w, "values").T)}
            edit.bindings.extend(Binding(b.key, nid, "weight", Transform.parse(b.transform).then("transpose").text)
                                 for b in self.bundle.roles.for_node(w) if b.role == "values")
        value = payload.get(bias.id, "values")
        steps = [Step("reshape", (n,))]
        if value.dtype not in (np.float32, np.float64):  # a narrow float bias is computed in binary32
            value, steps = value.astype(np.float32), steps + [Step("cast", dtype="float32")]
        edit.payload[nid]["bias"] = np.ascontiguousarray(value.reshape(n))
        for b in self.bundle.roles.for_node(bias.id):
            if b.role == "values":
                t = Transform.parse(b.transform).then(steps[0], value.shape)
                edit.bindings.append(Binding(b.key, nid, "bias", (t.then(steps[1]) if len(steps) > 1 else t).text))
        edit.new_id[add.id] = nid
        self.details.append(f"node {add.id} add + node {product.id} {product.kind} -> linear")


def fuse_linear_bias(bundle: Bundle) -> tuple[Bundle, Note]:
    return _Fuser(bundle).run()
