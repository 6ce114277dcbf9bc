"""torchlean.ir.v1 codec: exact importer messages, determinism, round trips, corruption safety."""

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import torchlean_bridge as tlb
from importers.builder import GraphBuilder
from torchlean_bridge.wire import dump_graph, dumps_document, graph_to_wire, loads_document, parse_document
from tests.conftest import FIXTURES
from torchlean_bridge.graph import Node, Source

SEED_DOC = json.loads((FIXTURES / "seed_mlp.json").read_text())


def minimal(**root):
    doc = {"format": "torchlean.ir.v1", "input_id": 0, "output_ids": [2],
           "nodes": [{"id": 0, "kind": "input", "parents": [], "shape": [1, 4]},
                     {"id": 1, "kind": "relu", "parents": [0], "shape": [1, 4]},
                     {"id": 2, "kind": "sum", "parents": [1], "shape": []}]}
    doc.update(root)
    return doc


def message(doc, **kw):
    with pytest.raises(tlb.BridgeError) as e:
        g, _ = parse_document(doc, **kw)
        tlb.check(g)
    return str(e.value)


def test_minimal_example_is_accepted():
    g = tlb.load_graph(minimal())
    assert (len(g), g.inputs, g.outputs) == (3, (0,), (2,))


@pytest.mark.parametrize("mutate, expected", [
    (lambda d: d.pop("format"), "PyTorch graph import: root: missing field `format`"),
    (lambda d: d.update(format="onnx"), "PyTorch graph import: unsupported format `onnx` (expected `torchlean.ir.v1`)"),
    (lambda d: d.update(output_ids=[]), "PyTorch graph import: root.output_ids must contain at least one output"),
    (lambda d: d.update(input_id=-1), "PyTorch graph import: root.input_id: expected natural number, got -1"),
    (lambda d: d.update(input_id=1.0), "PyTorch graph import: root.input_id: expected natural number, got 1.0"),
    (lambda d: d.update(nodes=[]), "PyTorch graph import: graph contains no nodes"),
    (lambda d: d["nodes"][1].update(parents=[2]), "PyTorch graph import: node[1]: parent id 2 is not < 1"),
    (lambda d: d["nodes"][1].update(kind="fft"), "PyTorch graph import: node[1]: unsupported TorchLean IR op kind `fft`"),
    (lambda d: d["nodes"][1].pop("shape"), "PyTorch graph import: node[1]: missing field `shape`"),
    (lambda d: d["nodes"][1].update(value_kind="blob"), "PyTorch graph import: node[1]: unsupported value_kind `blob`"),
    (lambda d: d["nodes"][1].update(kind="permute", perm=[1, "0"]),
     'PyTorch graph import: node[1].perm: expected natural number, got "0"'),
    (lambda d: d["nodes"][1].update(kind="max_pool", spatial_rank=1, kernel=[2, 2], stride=[1], padding=[0]),
     "PyTorch graph import: node[1].kernel: expected 1 entries, got 2"),
    (lambda d: d["nodes"][1].update(kind="softmax"), "PyTorch graph import: node[1]: missing field `axis`"),
    (lambda d: d.update(output_ids=[9]), "PyTorch graph import: raw node id 9 out of bounds"),
    (lambda d: d["nodes"][1].update(parents=[0, 0]),
     "IR graph: node 1: bad parent count for relu: expected 1..1, got 2 (Node(id=1, kind=relu, parents=#[0, 0], outShape=[1, 4]))"),
    (lambda d: d["nodes"][1].update(shape=[1, 5]),
     "IR graph: node 1: outShape mismatch: inferred=[1, 4], declared=[1, 5] (Node(id=1, kind=relu, parents=#[0], outShape=[1, 5]))"),
    (lambda d: d["nodes"][1].update(kind="concat", axis=0),
     "IR graph: node 1: bad parent count for concat: expected at least 2, got 1 (Node(id=1, kind=concat(axis=0), parents=#[0], outShape=[1, 4]))"),
    (lambda d: d["nodes"][2].update(kind="reduce_sum", axes=[3], keepdim=False),
     "PyTorch graph import: node[2]: reduction axis is outside rank 2"),
    (lambda d: d["nodes"][2].update(kind="reduce_sum", axes=[1], keepdim=True),
     "PyTorch graph import: node[2]: reduction shape mismatch: computed [1, 1], declared []"),
    (lambda d: d["nodes"][1].update(shape=[100000, 100000, 1000]),
     "PyTorch graph import: node[1].shape: declared shape [100000, 100000, 1000] has 10000000000000 elements, "
     "above the limit of 2147483648"),
])
def test_importer_messages(mutate, expected):
    doc = minimal()
    mutate(doc)
    assert message(doc) == expected


def test_strict_mode_rejects_extensions_like_torchlean():
    doc = minimal()
    doc["nodes"][1]["kind"] = "gelu"
    assert message(doc, strict=True) == "PyTorch graph import: node[1]: unsupported TorchLean IR op kind `gelu`"
    tlb.check(parse_document(doc)[0])  # ours accepts the ext op
    doc["nodes"][1].update(kind="custom", name="f", input_shapes=[[1, 4]], output_shape=[1, 4])
    assert message(doc, strict=True) == "PyTorch graph import: node[1]: custom computations need a checked Lean body"


def test_reduction_wire_forms():
    doc = minimal()
    doc["nodes"][2].update(kind="reduce_mean", axes=[1], keepdim=False, shape=[1])
    g, _ = parse_document(doc)
    assert (g[2].kind, g[2].attrs["axis"]) == ("reduce_mean", 1)
    doc["nodes"][2].update(axes=[0, 1], keepdim=True, shape=[1, 1])
    g, _ = parse_document(doc)
    assert (g[2].kind, g[2].attrs["axes"], g[2].attrs["keepdim"]) == ("reduce_mean_axes", (0, 1), True)
    assert dump_graph(g)["nodes"][2]["kind"] == "reduce_mean"


def test_inline_payload_round_trip():
    g, payload = parse_document(SEED_DOC)
    assert payload.get(1, "weight").shape == (5, 4)
    text = dumps_document(graph_to_wire(g, payload))
    assert text == (FIXTURES / "seed_mlp.json").read_text()


def test_malformed_text_is_a_bridge_error():
    from torchlean_bridge.errors import WireError
    for bad in [b"{", b"[1, 2", b'{"format": NaN}', b"\xff\xfe", b"[" * 100000 + b"]" * 100000, b"1" * 5000]:
        with pytest.raises(WireError, match=r"^PyTorch graph import: (invalid JSON: |document is nested too deeply$)"):
            parse_document(loads_document(bad))


def test_inline_tensor_mismatch_message():
    doc = json.loads(json.dumps(SEED_DOC))
    doc["nodes"][1]["weight"] = doc["nodes"][1]["weight"][:3]
    assert message(doc) == "PyTorch graph import: node[1].weight: tensor does not match [5, 4]"


# -- property tests -----------------------------------------------------------------------------

UNARY = ["relu", "tanh", "sigmoid", "exp", "abs", "sin", "gelu", "neg", "detach"]


@st.composite
def random_graphs(draw):
    b = GraphBuilder("test")
    rank = draw(st.integers(1, 3))
    x = b.input(tuple(draw(st.lists(st.integers(1, 4), min_size=rank, max_size=rank))))
    ids = [x]
    for _ in range(draw(st.integers(1, 12))):
        src = draw(st.sampled_from(ids))
        shape = b.shape(src)
        choice = draw(st.integers(0, 7))
        if choice == 0:
            source = draw(st.none() | st.builds(Source, framework=st.sampled_from(["fx", "onnx"]),
                                                name=st.text("abc_.0", min_size=1, max_size=6),
                                                target=st.none() | st.just("aten.relu.default"),
                                                module=st.none() | st.just("encoder.0"), folded=st.booleans()))
            ids.append(b.add(draw(st.sampled_from(UNARY)), [src], source=source))
        elif choice == 1:
            ids.append(b.add("add", [src, src]))
        elif choice == 2 and shape:
            ids.append(b.add("softmax", [src], {"axis": draw(st.integers(0, len(shape) - 1))}))
        elif choice == 3 and shape:
            perm = draw(st.permutations(range(len(shape))))
            ids.append(b.add("permute", [src], {"perm": perm}))
        elif choice == 4:
            ids.append(b.add("reshape", [src], {"in_shape": shape, "out_shape": (int(np.prod(shape)),)}))
        elif choice == 5 and shape:
            axes = draw(st.lists(st.integers(0, len(shape) - 1), unique=True, min_size=1))
            ids.append(b.add(draw(st.sampled_from(["reduce_sum_axes", "reduce_mean_axes", "reduce_max"])), [src],
                             {"axes": tuple(axes), "keepdim": draw(st.booleans())}))
        elif choice == 6 and shape:
            ids.append(b.add("concat", [src, src], {"axis": draw(st.integers(0, len(shape) - 1))}))
        elif choice == 7 and shape:
            ids.append(b.add("linear", [src], shape=shape[:-1] + (draw(st.integers(1, 5)),)))
    return b.finish([ids[-1]], keep_dead=True).graph


def wire_canonical(g: tlb.Graph) -> tlb.Graph:
    """The graph the wire format promises to give back: a one-axis reduce_sum_axes/reduce_mean_axes
    without keepdim is written in TorchLean's v1 spelling and read back as reduce_sum/reduce_mean;
    every other node, attribute, shape, element type and the interface come back unchanged."""
    nodes = []
    for n in g:
        if n.kind in ("reduce_sum_axes", "reduce_mean_axes") and len(n.attrs["axes"]) == 1 and not n.attrs["keepdim"]:
            n = Node(n.id, n.parents, n.kind[:-len("_axes")], n.out_shape, {"axis": n.attrs["axes"][0]}, n.dtype,
                     n.source)
        nodes.append(n)
    return tlb.Graph(nodes, g.inputs, g.outputs)


def assert_same_graph(got: tlb.Graph, want: tlb.Graph) -> None:
    assert (got.inputs, got.outputs, len(got)) == (want.inputs, want.outputs, len(want))
    for a, b in zip(got, want):
        assert (a.id, a.parents, a.kind, a.out_shape, dict(a.attrs), a.dtype) == \
               (b.id, b.parents, b.kind, b.out_shape, dict(b.attrs), b.dtype), (a, b)
        assert a.source == b.source, (a.source, b.source)


@settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(random_graphs())
def test_read_of_write_is_the_same_graph(g):
    """load(dump(g)) equals g node by node (kinds included, reductions in their v1 spelling), and
    writing it again gives the same bytes."""
    text = dumps_document(dump_graph(g))
    g2 = tlb.load_graph(text)
    tlb.check(g2)
    assert_same_graph(g2, wire_canonical(g))
    assert_same_graph(tlb.load_graph(dumps_document(dump_graph(g2))), g2)
    assert dumps_document(dump_graph(g2)) == text


def test_one_axis_reductions_come_back_in_their_v1_spelling_and_the_rest_unchanged():
    b = GraphBuilder("test")
    x = b.input((2, 3, 4))
    outs = [b.add(kind, [x], {"axes": axes, "keepdim": keep}) for kind in ("reduce_sum_axes", "reduce_mean_axes")
            for axes, keep in (((1,), False), ((1,), True), ((0, 2), False))]
    g = b.finish(outs, keep_dead=True).graph
    g2 = tlb.load_graph(dumps_document(dump_graph(g)))
    assert [(n.kind, dict(n.attrs)) for n in g2][1:] == [
        ("reduce_sum", {"axis": 1}), ("reduce_sum_axes", {"axes": (1,), "keepdim": True}),
        ("reduce_sum_axes", {"axes": (0, 2), "keepdim": False}),
        ("reduce_mean", {"axis": 1}), ("reduce_mean_axes", {"axes": (1,), "keepdim": True}),
        ("reduce_mean_axes", {"axes": (0, 2), "keepdim": False})]
    assert_same_graph(g2, wire_canonical(g))


JSON_JUNK = st.recursive(st.none() | st.booleans() | st.integers(-3, 10 ** 12) | st.floats(allow_nan=False)
                         | st.text(max_size=5), lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=4), c, max_size=3),
                         max_leaves=6)


def corrupted_seed(data: st.DataObject) -> dict:
    """The seed document with 1-3 fields of the root or of its nodes deleted or replaced by junk."""
    doc = json.loads(json.dumps(SEED_DOC))
    for _ in range(data.draw(st.integers(1, 3))):
        nodes = doc.get("nodes")
        candidates = [doc] + ([n for n in nodes if isinstance(n, dict) and n] if isinstance(nodes, list) else [])
        target = data.draw(st.sampled_from(candidates))
        if not target:
            continue
        key = data.draw(st.sampled_from(sorted(target)))
        if data.draw(st.booleans()):
            del target[key]
        else:
            target[key] = data.draw(JSON_JUNK)
    return doc


@settings(max_examples=300, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_corrupted_documents_only_raise_bridge_errors(data):
    doc = corrupted_seed(data)
    try:
        g, payload = parse_document(doc)
        tlb.check(g, collect=True)
    except tlb.BridgeError:
        pass


def test_provenance_fields_are_type_checked():
    doc = minimal()
    doc["nodes"][1]["source"] = {"name": 3}
    assert message(doc) == "PyTorch graph import: node[1].source.name: expected string, got 3"


def test_conv_input_spatial_must_match_the_parent():
    conv = dict(kind="conv", parents=[0], shape=[2, 4], spatial_rank=1, kernel=[1], stride=[1], padding=[0],
                padding_after=[0], dilation=[1], groups=1, channel_axis=0, in_channels=1, out_channels=2,
                weight=[[[1.0]], [[2.0]]], bias=[0.0, 0.0], input_spatial=[5])
    doc = {"format": "torchlean.ir.v1", "input_id": 0, "output_ids": [1],
           "nodes": [{"id": 0, "kind": "input", "parents": [], "shape": [1, 4]}, {"id": 1, **conv}]}
    assert message(doc) == "PyTorch graph import: node[1].input_spatial: payload input shape [5] does not match parent shape [4]"
    doc["nodes"][1]["input_spatial"] = [4]
    tlb.check(parse_document(doc)[0])


def test_wire_reductions_need_non_empty_axes_like_torchleans_lowering():
    doc = minimal()
    doc["nodes"][0]["shape"] = doc["nodes"][1]["shape"] = [0, 4]
    doc["nodes"][2].update(kind="reduce_sum", axes=[0, 1], keepdim=True, shape=[1, 1])
    assert message(doc) == "IR graph: node 2: invalid or empty reduction axis 0 for shape [0, 4]"
