"""Regression tests for issue #12: each class of hostile input is refused where it enters, with a
BridgeError naming where and what; op buffers are sized before allocation; multi-file outputs are
written as a unit."""

from __future__ import annotations

import copy
import json
import re
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import torchlean_bridge as tlb
from exporters.folder import GRAPH_FILE, MANIFEST_FILE, PAYLOAD_FILE, REPORT_FILE, ROLES_FILE
from torchlean_bridge.app.cli import main
from torchlean_bridge.errors import CheckpointError, GraphError, PayloadError, WireError
from torchlean_bridge.graph import Graph, Node
from torchlean_bridge.seed import SEED_X0, seed_mlp_bundle
from torchlean_bridge.wire import parse_document

ROOT = Path(__file__).resolve().parents[1]


def seed_doc() -> dict:
    return tlb.export_torchlean(seed_mlp_bundle(), None)


def conv_doc(groups: int = 1, **attrs) -> dict:
    """One inline conv: input [1, 2, 4] (channel axis 1), out 2 channels, kernel 3."""
    conv = {"id": 1, "kind": "conv", "parents": [0], "shape": [1, 2, 2], "spatial_rank": 1, "kernel": [3],
            "stride": [1], "padding": [0], "padding_after": [0], "dilation": [1], "groups": groups,
            "channel_axis": 1, "in_channels": 2, "out_channels": 2,
            "weight": [[[0.1, 0.2, 0.3], [0.4, 0.5, 0.6]], [[0.7, 0.8, 0.9], [1.0, 1.1, 1.2]]], "bias": [0.0, 1.0]}
    conv.update(attrs)
    return {"format": "torchlean.ir.v1", "input_id": 0, "output_ids": [1],
            "nodes": [{"id": 0, "kind": "input", "parents": [], "shape": [1, 2, 4]}, conv]}


def norm_doc(kind: str) -> dict:
    norm = {"id": 1, "kind": kind, "parents": [0], "shape": [2, 3]}
    if kind == "layernorm":
        norm.update(axis=1, eps=1e-5, gamma=[1.0, 1.0, 1.0], beta=[0.0, 0.0, 0.0])
    else:
        norm.update(channel_axis=1, channels=3, eps=1e-5, gamma=[1.0, 1.0, 1.0], beta=[0.0, 0.0, 0.0],
                    mean=[0.0, 0.0, 0.0], var=[1.0, 1.0, 1.0])
    return {"format": "torchlean.ir.v1", "input_id": 0, "output_ids": [1],
            "nodes": [{"id": 0, "kind": "input", "parents": [], "shape": [2, 3]}, norm]}


# -- silent acceptances: inline tensors take JSON numbers only ---------------------------------------

@pytest.mark.parametrize("bad", [True, False, "1e2", " 3 ", None])
@pytest.mark.parametrize("where", ["linear.weight", "linear.bias", "conv.weight", "conv.bias", "layernorm.gamma",
                                   "batch_norm_eval.beta", "batch_norm_eval.var", "const.values"])
def test_inline_tensors_refuse_non_numbers(where: str, bad) -> None:
    kind, field = where.split(".")
    if kind == "linear":
        doc = seed_doc()
        node = doc["nodes"][1]
    elif kind == "conv":
        doc = conv_doc()
        node = doc["nodes"][1]
    elif kind == "const":
        doc = {"format": "torchlean.ir.v1", "input_id": 0, "output_ids": [2],
               "nodes": [{"id": 0, "kind": "input", "parents": [], "shape": [2]},
                         {"id": 1, "kind": "const", "parents": [], "shape": [2], "values": [1.0, 2.0]},
                         {"id": 2, "kind": "add", "parents": [0, 1], "shape": [2]}]}
        node = doc["nodes"][1]
    else:
        doc = norm_doc(kind)
        node = doc["nodes"][1]
    parse_document(copy.deepcopy(doc))  # the unmutated document is accepted
    target = node[field]
    while isinstance(target[0], list):
        target = target[0]
    target[0] = bad
    with pytest.raises(WireError, match=rf"node\[1\]\.{field}: tensor entries must be numbers, got"):
        parse_document(doc)


def test_inline_tensor_of_numbers_still_reads_ints_and_floats() -> None:
    doc = seed_doc()
    doc["nodes"][1]["bias"] = [1, 2, 3.5, 0, -4]
    _, payload = parse_document(doc)
    assert payload.get(1, "bias").tolist() == [1.0, 2.0, 3.5, 0.0, -4.0]


def test_inline_grouped_conv_reads_the_diagonal_blocks_and_writes_them_back_dense() -> None:
    doc = conv_doc(groups=2)
    dense = doc["nodes"][1]["weight"]
    dense[0][1] = [0.0, 0.0, 0.0]
    dense[1][0] = [0.0, 0.0, 0.0]
    g, payload = parse_document(doc)
    np.testing.assert_array_equal(payload.get(1, "weight"), [[[0.1, 0.2, 0.3]], [[1.0, 1.1, 1.2]]])
    assert tlb.export_torchlean(tlb.Bundle(g, payload), None)["nodes"][1]["weight"] == dense


def test_inline_grouped_conv_with_weights_across_groups_is_refused() -> None:
    with pytest.raises(WireError, match="nonzero entries outside its groups' diagonal blocks"):
        parse_document(conv_doc(groups=2))  # every dense entry is nonzero


def test_inline_conv_with_huge_groups_is_refused_at_once() -> None:
    start = time.monotonic()
    with pytest.raises(WireError, match="groups 2147483648 must be > 0 and divide"):
        parse_document(conv_doc(groups=2 ** 31))
    with pytest.raises(WireError, match="groups 0"):
        parse_document(conv_doc(groups=0))
    assert time.monotonic() - start < 1.0


# -- silent acceptances: payload names and records ---------------------------------------------------

def _rename_payload(folder: Path, old: str, new: str) -> None:
    """Rename one tensor and re-record every hash, so that only the name is wrong."""
    from safetensors import safe_open
    from safetensors.numpy import save_file

    from exporters.folder import file_sha256
    from torchlean_bridge.payload import tensor_sha256
    path = folder / PAYLOAD_FILE
    with safe_open(str(path), framework="numpy") as f:
        tensors = {(new if k == old else k): f.get_tensor(k) for k in f.keys()}
    save_file(tensors, str(path), metadata={"torchlean_bridge.sha256": json.dumps(
        {k: tensor_sha256(a) for k, a in tensors.items()})})
    manifest = json.loads((folder / MANIFEST_FILE).read_text())
    manifest["files"][PAYLOAD_FILE] = {"bytes": path.stat().st_size, "sha256": file_sha256(path)}
    (folder / MANIFEST_FILE).write_text(json.dumps(manifest))


@pytest.mark.parametrize("name, message", [
    ("01.weight", "tensor name '01.weight' is not `<node id>.<role>`"),
    ("1..weight", "tensor name '1..weight' is not `<node id>.<role>`"),
    ("+1.weight", "is not `<node id>.<role>`"),
    ("1.weight ", "is not `<node id>.<role>`"),
    ("1.bogus", r"node 1 \(linear\) has no role `bogus`"),
    ("2.weight", r"node 2 \(relu\) has no role `weight`"),
    ("9.weight", "record for node 9, which is not in the graph"),
    ("9" * 5000 + ".weight", "a decimal node id below 10\\*\\*18"),  # int() of it would raise ValueError
])
def test_bundle_payload_names_must_be_canonical_and_fit_the_graph(tmp_path, name: str, message: str) -> None:
    tlb.save(seed_mlp_bundle(), tmp_path / "b")
    assert tlb.load(tmp_path / "b") == seed_mlp_bundle()
    _rename_payload(tmp_path / "b", "1.weight", name)
    with pytest.raises(PayloadError, match=message):
        tlb.load(tmp_path / "b")


def test_inline_fields_on_a_node_without_payload_roles_are_not_read(tmp_path) -> None:
    doc = seed_doc()
    doc["nodes"][2]["weight"] = [[1.0]]  # relu has no payload: ignored by the reader, as TorchLean does
    (tmp_path / "g.json").write_text(json.dumps(doc))
    assert tlb.load(tmp_path / "g.json").payload.get(2, "weight") is None


# -- safetensors payload headers --------------------------------------------------------------------

def _payload_file(tmp_path: Path) -> Path:
    from exporters.payload_safetensors import write_payload
    path = tmp_path / "p.safetensors"
    write_payload(seed_mlp_bundle().payload, path)
    return path


def _with_header(path: Path, edit) -> None:
    data = path.read_bytes()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    edit(header)
    text = json.dumps(header).encode()
    path.write_bytes(len(text).to_bytes(8, "little") + text + data[8 + n:])


@pytest.mark.parametrize("edit, message", [
    (lambda h: h["1.bias"].update(dtype="F8_E9"), "element type F8_E9 is not one of"),
    (lambda h: h["1.bias"].update(shape=[-5]), "is not a list of natural numbers"),
    (lambda h: h["1.bias"].update(shape=[2 ** 40, 2 ** 40]), "above the limit"),
    (lambda h: h["1.bias"].update(data_offsets=[0, 10 ** 12]), "are not within"),
    (lambda h: h["1.bias"].update(data_offsets=[0, 8]), "data bytes for shape"),
    (lambda h: h["1.weight"].update(data_offsets=h["1.bias"]["data_offsets"]), "data bytes for shape|overlap"),
    (lambda h: h.update({"1.extra": {"dtype": "F64", "shape": [0], "data_offsets": [0, 0], "x": 1}}),
     "expected {dtype, shape, data_offsets}"),
])
def test_corrupted_payload_headers_are_refused(tmp_path, edit, message: str) -> None:
    from exporters.payload_safetensors import payload_from_file
    path = _payload_file(tmp_path)
    assert payload_from_file(path) == seed_mlp_bundle().payload
    _with_header(path, edit)
    with pytest.raises(tlb.BridgeError, match=message):
        payload_from_file(path)


def test_payload_header_length_past_the_file_is_refused(tmp_path) -> None:
    from exporters.payload_safetensors import payload_from_file
    path = _payload_file(tmp_path)
    data = bytearray(path.read_bytes())
    data[:8] = (2 ** 62).to_bytes(8, "little")
    path.write_bytes(bytes(data))
    with pytest.raises(tlb.BridgeError, match="header length .* does not fit"):
        payload_from_file(path)


def test_payload_is_read_memory_mapped_and_written_in_the_safetensors_layout(tmp_path) -> None:
    import mmap

    from safetensors.numpy import load_file

    from exporters.payload_safetensors import payload_from_file
    path = _payload_file(tmp_path)
    payload = payload_from_file(path)
    for _, _, arr in payload.items():
        base = arr
        while isinstance(base, np.ndarray) and base.base is not None:
            base = base.base
        base = base.obj if isinstance(base, memoryview) else base
        assert isinstance(base, mmap.mmap) and not arr.flags.writeable
    assert {k: v.tolist() for k, v in load_file(str(path)).items()} == \
        {k: v.tolist() for k, v in seed_mlp_bundle().payload.flat().items()}


# -- readers: non-regular files and size caps -------------------------------------------------------

@pytest.mark.parametrize("name", [GRAPH_FILE, ROLES_FILE, REPORT_FILE, PAYLOAD_FILE, MANIFEST_FILE])
@pytest.mark.parametrize("how", ["folder", "dev_zero", "fifo"])
def test_bundle_files_that_are_not_regular_files_are_refused(tmp_path, name: str, how: str) -> None:
    b = seed_mlp_bundle()
    b.report = {"note": 1}
    tlb.save(b, tmp_path / "b")
    target = tmp_path / "b" / name
    target.unlink()
    if how == "folder":
        target.mkdir()
    elif how == "dev_zero":
        target.symlink_to("/dev/zero")
    else:
        os.mkfifo(target)
    start = time.monotonic()
    refused = rf"{name}: it is (a folder|a device, FIFO or socket), not a regular" if how != "dev_zero" \
        else rf"{name} resolves outside the bundle folder \(a symlink to /dev/zero\)"
    with pytest.raises(tlb.BridgeError, match=refused):
        tlb.load(tmp_path / "b")
    assert time.monotonic() - start < 2.0


def test_graph_document_linked_to_dev_zero_is_refused(tmp_path) -> None:
    (tmp_path / "g.json").symlink_to("/dev/zero")
    with pytest.raises(tlb.BridgeError, match="not a regular file"):
        tlb.load_graph(tmp_path / "g.json")
    with pytest.raises(tlb.BridgeError, match="not a regular file"):
        tlb.load(tmp_path / "g.json")


def test_documents_above_the_size_cap_are_refused_before_reading(tmp_path) -> None:
    from torchlean_bridge.fileio import read_capped
    (tmp_path / "big.json").write_bytes(b" " * 1001)
    with pytest.raises(tlb.BridgeError, match="1001 bytes, above the limit of 1000"):
        read_capped(tmp_path / "big.json", "graph document", limit=1000)


def test_declared_rank_above_the_limit_is_refused() -> None:
    doc = seed_doc()
    doc["nodes"][0]["shape"] = [1] * 65
    with pytest.raises(WireError, match="rank 65, above the limit of 32"):
        parse_document(doc)


# -- op buffers are sized in the shape rule -----------------------------------------------------------

def _graph(*nodes: Node, inputs=(0,)) -> Graph:
    return Graph(list(nodes), list(inputs), [nodes[-1].id])


def _conv_node(**over) -> Node:
    attrs = dict(spatial_rank=2, kernel=(1, 1), stride=(10 ** 7, 10 ** 7), padding=(10 ** 6, 10 ** 6),
                 padding_after=(10 ** 6, 10 ** 6), dilation=(1, 1), groups=1, channel_axis=1, in_channels=1,
                 out_channels=1)
    attrs.update(over)
    return Node(1, [0], "conv", (1, 1, 1, 1), attrs)


def test_conv_with_huge_padding_and_stride_is_refused_by_check_before_evaluation() -> None:
    from semantics.evaluate import evaluate
    g = _graph(Node(0, [], "input", (1, 1, 2, 2)), _conv_node())
    payload = tlb.Payload({1: {"weight": np.ones((1, 1, 1, 1)), "bias": np.zeros(1)}})
    with pytest.raises(GraphError, match="conv: evaluating it needs a padded input of 4000008000004 elements"):
        tlb.check(g)
    with pytest.raises(tlb.BridgeError, match="padded input"):
        evaluate(g, payload, np.zeros((1, 1, 2, 2)))
    from semantics.interval import interval_bounds
    with pytest.raises(tlb.BridgeError, match="padded input"):
        interval_bounds(g, payload, np.zeros((1, 1, 2, 2)), np.ones((1, 1, 2, 2)))


def test_conv_with_a_huge_kernel_is_refused_for_its_im2col_block() -> None:
    g = _graph(Node(0, [], "input", (1, 1, 300, 300)),
               Node(1, [0], "conv", (1, 1, 151, 151), dict(spatial_rank=2, kernel=(150, 150), stride=(1, 1),
                                                           padding=(0, 0), padding_after=(0, 0), dilation=(1, 1),
                                                           groups=1, channel_axis=1, in_channels=1, out_channels=1)))
    assert tlb.check(g, max_elements=2 ** 31) == []
    with pytest.raises(GraphError, match="an im2col block of 3397500 elements, above the limit of 1000000"):
        tlb.check(g, max_elements=10 ** 6)


def test_max_pool_with_a_huge_kernel_is_refused() -> None:
    pool = dict(spatial_rank=1, kernel=(10 ** 9,), stride=(1,), padding=(5 * 10 ** 8,))
    g = _graph(Node(0, [], "input", (1, 1, 4)), Node(1, [0], "max_pool", (1, 1, 5), pool))
    with pytest.raises(GraphError, match="max_pool: evaluating it needs a window table of 5000000000 elements"):
        tlb.check(g)
    nd = dict(pool, padding_after=(5 * 10 ** 8,), dilation=(1,), ceil_mode=False, count_include_pad=True)
    g = _graph(Node(0, [], "input", (1, 1, 4)), Node(1, [0], "avg_pool_nd", (1, 1, 5), nd))
    with pytest.raises(GraphError, match="avg_pool_nd: evaluating it needs"):
        tlb.check(g)


def test_conv_transpose_buffers_are_sized() -> None:
    attrs = dict(spatial_rank=1, kernel=(3,), stride=(10 ** 6,), padding=(1500000,), padding_after=(1500000,),
                 output_padding=(0,), dilation=(1,), groups=1, channel_axis=1, in_channels=1, out_channels=1)
    g = _graph(Node(0, [], "input", (1, 1, 4)), Node(1, [0], "conv_transpose", (1, 1, 3), attrs))
    assert tlb.check(g) == []
    with pytest.raises(GraphError, match="conv_transpose: evaluating it needs an uncropped output of 3000003 "
                                         "elements, above the limit of 2000000"):
        tlb.check(g, max_elements=2 * 10 ** 6)


def test_window_attributes_above_the_limit_are_refused_before_any_strided_view() -> None:
    g = _graph(Node(0, [], "input", (1, 1, 4, 4)), _conv_node(stride=(2 ** 62, 1), padding=(0, 0),
                                                              padding_after=(0, 0)))
    with pytest.raises(GraphError, match=r"conv: stride \[4611686018427387904, 1\] has an entry above the limit"):
        tlb.check(g)
    g = _graph(Node(0, [], "input", (1, 1, 4, 4)), _conv_node(stride=(1,), padding=(0, 0), padding_after=(0, 0)))
    with pytest.raises(GraphError, match="conv: stride has 1 entries, expected spatial rank 2"):
        tlb.check(g)


def test_the_element_limit_applies_to_evaluation_too() -> None:
    from semantics.evaluate import evaluate
    from torchlean_bridge.ops.contracts import element_limit
    b = seed_mlp_bundle()
    with element_limit(4):
        with pytest.raises(GraphError, match="above the limit of 4"):
            evaluate(b.graph, b.payload, SEED_X0)
    assert evaluate(b.graph, b.payload, SEED_X0)[0].shape == ()


# -- checkpoints --------------------------------------------------------------------------------------

@pytest.mark.parametrize("damage, message", [
    (dict(data_type=999), "initializer `b`: data_type 999 is not an ONNX element type"),
    (dict(data_type=0), "initializer `b`: data_type 0 is not an ONNX element type"),
    (dict(dims=[-2]), r"initializer `b`: negative dimension in \[-2\]"),
    (dict(dims=[2 ** 40, 2 ** 40]), "initializer `b`: shape .* above the limit")])
def test_onnx_checkpoint_with_a_damaged_initializer_header_is_refused(tmp_path, damage, message) -> None:
    import onnx
    from onnx import helper, numpy_helper
    good = numpy_helper.from_array(np.ones((2, 2), np.float32), "w")
    bad = numpy_helper.from_array(np.ones((2,), np.float32), "b")
    for field, value in damage.items():
        if field == "dims":
            del bad.dims[:]
            bad.dims.extend(value)
        else:
            setattr(bad, field, value)
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2])], [good, bad])
    path = tmp_path / "m.onnx"
    path.write_bytes(helper.make_model(graph).SerializeToString())
    with pytest.raises(CheckpointError, match=f"ONNX model {re.escape(str(path))}: {message}"):
        tlb.load_checkpoint(path)


def _mutations(data: bytes) -> list[bytes]:
    """Truncations at every 7th byte and single-byte corruptions at every 5th."""
    out = [data[:i] for i in range(0, len(data), 7)]
    for i in range(0, len(data), 5):
        b = bytearray(data)
        b[i] ^= 0xFF
        out.append(bytes(b))
    return out


@pytest.mark.parametrize("legacy", [False, True])
def test_corrupted_pytorch_checkpoints_raise_checkpoint_errors(tmp_path, legacy: bool) -> None:
    import torch
    path = tmp_path / "w.pt"
    torch.save({"w": torch.arange(6.0).reshape(2, 3), "n": torch.tensor([1, 2])}, path,
               _use_new_zipfile_serialization=not legacy)
    assert sorted(tlb.load_checkpoint(path)) == ["n", "w"]
    data = path.read_bytes()
    kinds = set()
    for mutated in _mutations(data):
        path.write_bytes(mutated)
        try:
            ckpt = tlb.load_checkpoint(path)
            for key in ckpt:
                ckpt[key].sum()
            kinds.add("read")
        except CheckpointError:
            kinds.add("refused")
    assert "refused" in kinds


@pytest.mark.parametrize("shape, text", [
    ([float("inf")], "[Infinity]"), ([1e300, 0], "[1e+300, 0]"), ([2 ** 40, 2 ** 40], "[1099511627776, 1099511627776]"),
    ([2 ** 64 + 6], "[18446744073709551622]"), ([-1, 3], "[-1, 3]"), ([True], "[true]"), (["3"], '["3"]'),
    ([2.0, 3], "[2.0, 3]"), (None, "null"), ([[2, 3]], "[[2, 3]]")])
def test_json_checkpoint_meta_shapes_must_be_natural_numbers_within_the_limit(tmp_path, shape, text) -> None:
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"params": {"w": [1.0, 2.0, 3.0, 4.0, 5.0, 6.0], "b": [0.0]},
                                "meta": {"w": {"shape": shape}}}))
    with pytest.raises(CheckpointError, match=re.escape(f"JSON checkpoint {path}: meta.w.shape: {text}")):
        tlb.load_checkpoint(path)
    path.write_text(json.dumps({"params": {"w": [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]}, "meta": {"w": {"shape": [2, 3]}}}))
    assert tlb.load_checkpoint(path)["w"].shape == (2, 3)


def test_json_checkpoint_with_deep_nesting_is_refused_or_noted(tmp_path) -> None:
    path = tmp_path / "c.json"
    path.write_text('{"w": ' + "[" * 100000 + "1" + "]" * 100000 + "}")
    with pytest.raises(CheckpointError, match="nested too deeply"):
        tlb.load_checkpoint(path)
    path.write_text('{"w": ' + "[" * 500 + "1" + "]" * 500 + ', "b": [1]}')
    ckpt = tlb.load_checkpoint(path)
    assert list(ckpt) == ["b"] and [f.keys for f in ckpt.findings if f.kind == "non_tensor"] == [("w",)]


def test_json_checkpoint_values_that_do_not_fit_the_dtype_are_noted(tmp_path) -> None:
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"params": {"n": [2 ** 70], "ok": [1]},
                                "meta": {"n": {"dtype": "torch.int64"}, "ok": {"dtype": ["x"]}}}))
    ckpt = tlb.load_checkpoint(path)
    assert list(ckpt) == [] and sorted(f.keys for f in ckpt.findings) == [("n",), ("ok",)]


# -- CLI arguments: exit 2, one line, never a traceback -----------------------------------------------

@pytest.fixture()
def cli_files(tmp_path):
    tlb.save(seed_mlp_bundle(), tmp_path / "b")
    np.save(tmp_path / "x.npy", np.asarray(SEED_X0))
    (tmp_path / "empty.npy").write_bytes(b"")
    from safetensors.numpy import save_file
    save_file({k: np.asarray(v) for k, v in seed_mlp_bundle().payload.flat().items()}, str(tmp_path / "w.safetensors"))
    (tmp_path / "m.py").write_text("import torch\n\ndef make():\n    return torch.nn.Linear(4, 3)\n")
    return tmp_path


def _cli(capsys, *argv: str) -> tuple[int, str]:
    code = main([str(a) for a in argv])
    err = capsys.readouterr().err
    return code, err


@pytest.mark.parametrize("argv, message", [
    (["eval", "{b}", "--input", "{empty}"], "cannot read array .*empty.npy: the file is empty"),
    (["bounds", "{b}", "--center", "{empty}", "--radius", "0.1"], "the file is empty"),
    (["audit", "{b}", "--checkpoint", "{w}", "--input", "{empty}", "--golden", "{x}"], "the file is empty"),
    (["eval", "{b}", "--input", "{b}"], "it is a folder, not a regular file"),
    (["eval", "{b}", "--input", "/dev/zero"], "not a regular file"),
    (["bounds", "{b}", "--center", "{x}", "--radius", "0.1", "--seed", "-1"], "--seed must be between 0 and"),
    (["bounds", "{b}", "--center", "{x}", "--radius", "0.1", "--samples", "10000000000"],
     "--samples must be between 0 and 10000, got 10000000000"),
    (["bounds", "{b}", "--center", "{x}", "--radius", "nan"], "--radius must be a finite number"),
    (["audit", "{b}", "--checkpoint", "{w}", "--seed", "-5"], "--seed must be between"),
    (["audit", "{b}", "--checkpoint", "{w}", "--tolerance", "inf"], "--tolerance must be a finite number"),
    (["diff", "{b}", "--against", "reference-evaluator", "--random", "-3"], "--random must be between 0"),
    (["import", "{m}:make", "--input-shape", "99999999999,99999999", "-o", "{out}"], "above the limit of 67108864"),
    (["import", "{m}:make", "--input-shape", ",".join(["1"] * 40), "-o", "{out}"], "rank 40 is above the limit"),
])
def test_bad_cli_arguments_exit_2_with_one_line(cli_files, capsys, argv: list[str], message: str) -> None:
    names = {"b": cli_files / "b", "x": cli_files / "x.npy", "empty": cli_files / "empty.npy",
             "w": cli_files / "w.safetensors", "m": cli_files / "m.py", "out": cli_files / "out"}
    start = time.monotonic()
    code, err = _cli(capsys, *(a.format(**names) for a in argv))
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith("error: ") and "Traceback" not in err
    import re
    assert re.search(message, err), err
    assert time.monotonic() - start < 10


# -- atomicity: bundle folders and JSON + payload pairs -------------------------------------------------

def _other_bundle() -> tlb.Bundle:
    b = seed_mlp_bundle()
    b.payload.set(1, "bias", b.payload.get(1, "bias") + 1.0)
    b.report = {"other": True}
    return b


def test_save_writes_a_manifest_that_load_verifies(tmp_path) -> None:
    tlb.save(seed_mlp_bundle(), tmp_path / "b")
    manifest = json.loads((tmp_path / "b" / MANIFEST_FILE).read_text())
    assert manifest["format"] == "torchlean_bridge.bundle.v1"
    assert sorted(manifest["files"]) == [GRAPH_FILE, PAYLOAD_FILE, REPORT_FILE, ROLES_FILE]
    (tmp_path / "b" / ROLES_FILE).write_text("[]\n")  # a valid file, but not the one written
    with pytest.raises(tlb.BridgeError, match="roles.json does not match its size and sha256 in manifest.json"):
        tlb.load(tmp_path / "b")


@pytest.mark.parametrize("name", [GRAPH_FILE, PAYLOAD_FILE, ROLES_FILE, MANIFEST_FILE])
def test_a_bundle_missing_a_file_is_refused_naming_it(tmp_path, capsys, name: str) -> None:
    tlb.save(seed_mlp_bundle(), tmp_path / "b")
    (tmp_path / "b" / name).unlink()
    with pytest.raises(tlb.BridgeError, match=name.replace(".", r"\.") + ".*missing|missing.*" + name):
        tlb.load(tmp_path / "b")
    code, err = _cli(capsys, "check", tmp_path / "b")
    assert code == 2 and name in err


def test_a_file_added_after_writing_is_refused(tmp_path) -> None:
    b = seed_mlp_bundle()
    b.report = {}
    tlb.save(b, tmp_path / "b")
    (tmp_path / "b" / REPORT_FILE).write_text("{}\n")
    with pytest.raises(tlb.BridgeError, match="report.json not listed in manifest.json"):
        tlb.load(tmp_path / "b")


def test_save_replaces_a_bundle_whole_and_refuses_a_folder_of_other_files(tmp_path) -> None:
    tlb.save(_other_bundle(), tmp_path / "b")
    tlb.save(seed_mlp_bundle(), tmp_path / "b")
    back = tlb.load(tmp_path / "b")
    assert back == seed_mlp_bundle() and back.report == seed_mlp_bundle().report
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b"]  # no temporary or aside folder left
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(tlb.BridgeError, match="refusing to replace"):
        tlb.save(seed_mlp_bundle(), tmp_path / "mine")
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"


def test_a_failure_midway_leaves_the_old_bundle(tmp_path, monkeypatch) -> None:
    import exporters.folder as folder
    tlb.save(_other_bundle(), tmp_path / "b")

    def broken(payload, path):
        Path(path).write_bytes(b"half")
        raise OSError("disk full")
    monkeypatch.setattr(folder, "write_payload", broken)
    with pytest.raises(OSError, match="disk full"):
        tlb.save(seed_mlp_bundle(), tmp_path / "b")
    assert tlb.load(tmp_path / "b") == _other_bundle()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b"]


def test_a_killed_save_leaves_the_old_or_the_new_bundle(tmp_path) -> None:
    """SIGKILL a process that saves two different bundles over one folder, at many moments: the folder
    always loads as one of them (or is absent), never as a mixture, and check never accepts a mixture."""
    script = tmp_path / "writer.py"
    script.write_text(
        "import sys\nsys.path.insert(0, %r)\n" % str(ROOT)
        + "import numpy as np, torchlean_bridge as tlb\nfrom torchlean_bridge.seed import seed_mlp_bundle\n"
        "a = seed_mlp_bundle(); b = seed_mlp_bundle(); b.payload.set(1, 'bias', np.ones(5))\n"
        "print('ready', flush=True)\n"
        "for i in range(100000):\n    tlb.save(a if i % 2 else b, sys.argv[1])\n")
    a, b = seed_mlp_bundle(), seed_mlp_bundle()
    b.payload.set(1, "bias", np.ones(5))
    target = tmp_path / "out"
    seen = set()
    for delay in (0.0, 0.013, 0.031, 0.057, 0.089, 0.13, 0.21):
        proc = subprocess.Popen([sys.executable, str(script), str(target)], stdout=subprocess.PIPE)
        assert proc.stdout.readline().strip() == b"ready"
        time.sleep(delay)
        proc.kill()
        proc.wait()
        proc.stdout.close()
        if target.exists():
            loaded = tlb.load(target)
            assert loaded == a or loaded == b
            seen.add("a" if loaded == a else "b")
    assert seen


def test_export_pair_is_tied_by_the_payload_hash(tmp_path, capsys) -> None:
    from exporters.payload_safetensors import write_payload
    from exporters.torchlean_json import payload_file_for
    doc = tmp_path / "m.json"
    tlb.export_torchlean(seed_mlp_bundle(), doc, inline_payload=False)
    back = tlb.load(doc)
    assert back.graph == seed_mlp_bundle().graph and back.payload == seed_mlp_bundle().payload
    # an export interrupted after the new payload but before the new document
    write_payload(_other_bundle().payload, payload_file_for(doc))
    with pytest.raises(tlb.BridgeError, match="does not match the size and sha256 the document records"):
        tlb.load(doc)
    code, err = _cli(capsys, "check", doc)
    assert code == 2 and "does not match" in err
    payload_file_for(doc).unlink()
    with pytest.raises(tlb.BridgeError, match="its payload file .* is missing"):
        tlb.load(doc)


def test_leftover_temporary_folders_are_ignored(tmp_path) -> None:
    tlb.save(seed_mlp_bundle(), tmp_path / "b")
    (tmp_path / ".b.tmp-xyz").mkdir()
    (tmp_path / ".b.tmp-xyz" / GRAPH_FILE).write_text("{}")
    assert tlb.load(tmp_path / "b") == seed_mlp_bundle()
    tlb.save(_other_bundle(), tmp_path / "b")
    assert tlb.load(tmp_path / "b") == _other_bundle()
    shutil.rmtree(tmp_path / ".b.tmp-xyz")


def test_check_refuses_declared_shapes_with_negative_extents() -> None:
    """Graphs built in code or by an importer (not only read from JSON) cannot carry a -1 extent."""
    g = _graph(Node(0, [], "input", (-1,)), Node(1, [0], "relu", (-1,)))
    with pytest.raises(GraphError, match=r"node 0: declared shape \[-1\] has a negative extent"):
        tlb.check(g)
    g = _graph(Node(0, [], "input", (0, 2 ** 62, 2 ** 62)), Node(1, [0], "relu", (0, 2 ** 62, 2 ** 62)))
    with pytest.raises(GraphError, match="has an extent above the limit"):
        tlb.check(g)
    doc = seed_doc()
    doc["nodes"][0]["shape"] = [0, 2 ** 62]
    with pytest.raises(WireError, match="has an extent above the limit"):
        parse_document(doc)


# -- ONNX classes a fresh fuzz campaign found: an empty required input name, an infinite Resize scale
def test_onnx_empty_name_in_a_required_input_is_refused():
    from onnx import TensorProto, helper
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])
    graph = helper.make_graph([helper.make_node("Where", ["c", "", "x"], ["y"])], "g",
                              [helper.make_tensor_value_info("c", TensorProto.BOOL, [3]), x],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(tlb.BridgeError, match=r"required input 1 \(`X`\) of Where-16 is empty"):
        tlb.import_onnx(m)


def test_onnx_infinite_resize_scale_is_refused():
    from onnx import TensorProto, helper
    scales = helper.make_tensor("scales", TensorProto.FLOAT, [2], [1.0, float("inf")])
    graph = helper.make_graph([helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="linear")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [scales])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(tlb.BridgeError, match="one positive finite factor per axis"):
        tlb.import_onnx(m)


def test_onnx_malformed_einsum_equation_is_refused_before_shape_inference():
    """onnx's shape inference loops forever on some malformed equations (found by the campaign)."""
    from onnx import TensorProto, helper, numpy_helper
    w = numpy_helper.from_array(np.ones((5, 4), np.float32), "W")
    graph = helper.make_graph([helper.make_node("Einsum", ["x", "W"], ["y"], equation="bik,dk-\x7f")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(tlb.BridgeError, match="Einsum equation .* is not letters, '...', commas and one optional"):
        tlb.import_onnx(m)


def test_onnx_checkpoint_with_a_non_utf8_initializer_name_is_refused(tmp_path):
    """Found by the campaign: the name came back as bytes and crashed the prefix stripping."""
    from onnx import helper, numpy_helper
    w = numpy_helper.from_array(np.ones(2, np.float32), "wXX")
    graph = helper.make_graph([], "g", [], [], [w])
    data = bytearray(helper.make_model(graph).SerializeToString())
    at = data.index(b"wXX")
    data[at + 1:at + 3] = b"\xff\xfe"
    path = tmp_path / "bad.onnx"
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="is not valid UTF-8"):
        tlb.load_checkpoint(path)


# -- found by a hostile-input sweep (12-01) ---------------------------------------------------------

def _external_tensor(name: str, dims: list[int]):
    from onnx import TensorProto
    t = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=dims)
    t.data_location = TensorProto.EXTERNAL
    return t


def test_an_onnx_checkpoint_reads_external_data_memory_mapped(tmp_path):
    """A checkpoint whose initializer lies in a 1 GiB external file is mapped, not read into memory
    (it used to be loaded whole before any check: a segfault under a memory limit)."""
    import onnx
    from onnx import TensorProto, helper
    data = tmp_path / "w.bin"
    with open(data, "wb") as f:
        f.truncate(1 << 30)  # sparse: no disk used
    w = _external_tensor("W", [1 << 28])
    for k, v in (("location", "w.bin"), ("offset", "0"), ("length", str(1 << 30))):
        w.external_data.add(key=k, value=v)
    graph = helper.make_graph([], "g", [], [helper.make_tensor_value_info("W", TensorProto.FLOAT, [1 << 28])], [w])
    onnx.save(helper.make_model(graph), str(tmp_path / "ck.onnx"))
    code = ("import resource, onnx, torchlean_bridge as tlb; from importers import checkpoints; "
            "peak = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss; before = peak(); "
            "c = tlb.load_checkpoint(%r); a = c.get('W'); "
            "assert a.shape == (1 << 28,) and not a.flags.writeable; print(peak() - before)" % str(tmp_path / "ck.onnx"))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout.split()[-1]) < 300_000  # KiB of peak growth: the 1 GiB tensor was never read


def test_an_onnx_checkpoint_with_external_data_outside_its_folder_is_a_finding(tmp_path):
    import onnx
    from onnx import TensorProto, helper
    (tmp_path / "secret.bin").write_bytes(b"\0" * 16)
    (tmp_path / "m").mkdir()
    w = _external_tensor("W", [4])
    w.external_data.add(key="location", value="../secret.bin")
    graph = helper.make_graph([], "g", [], [helper.make_tensor_value_info("W", TensorProto.FLOAT, [4])], [w])
    onnx.save(helper.make_model(graph), str(tmp_path / "m" / "ck.onnx"))
    ckpt = tlb.load_checkpoint(tmp_path / "m" / "ck.onnx")
    assert "W" not in ckpt.keys() and any("inside the model's folder" in f.message for f in ckpt.findings)


@pytest.mark.parametrize("kind", ["device", "folder"])
def test_file_outputs_never_replace_a_folder_or_a_device(tmp_path, capsys, kind):
    """A folder is refused; a device is written in place (here /dev/full's numbers: the write fails)."""
    import stat as stat_mod
    tlb.save(seed_mlp_bundle(), tmp_path / "b")
    target = tmp_path / "out"
    if kind == "device":
        if os.geteuid() != 0:
            pytest.skip("making a device node needs root")
        os.mknod(target, 0o666 | stat_mod.S_IFCHR, os.makedev(1, 7))  # /dev/full's numbers
    else:
        target.mkdir()
    for to in ("onnx", "torchlean"):
        code, err = _cli(capsys, "export", str(tmp_path / "b"), "--to", to, "-o", str(target))
        assert code == 2 and ("refusing to replace it" if kind == "folder" else "No space left on device") in err
        assert (target.is_dir() if kind == "folder" else stat_mod.S_ISCHR(os.lstat(target).st_mode))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b", "out"]  # no companion payload left behind


def test_an_interrupted_torchlean_export_leaves_neither_file(tmp_path, monkeypatch):
    """The document and its companion payload appear together or not at all."""
    import exporters.torchlean_json as tj
    real = tj.dumps_document

    def interrupted(doc):
        raise KeyboardInterrupt
    monkeypatch.setattr(tj, "dumps_document", interrupted)
    with pytest.raises(KeyboardInterrupt):
        tlb.export_torchlean(seed_mlp_bundle(), tmp_path / "m.json", inline_payload=False)
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setattr(tj, "dumps_document", real)
    tlb.export_torchlean(seed_mlp_bundle(), tmp_path / "m.json", inline_payload=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.json", "m.payload.safetensors"]


def test_bundle_files_linking_outside_the_folder_are_refused(tmp_path):
    tlb.save(seed_mlp_bundle(), tmp_path / "b")
    outside = tmp_path / "elsewhere.json"
    (tmp_path / "b" / ROLES_FILE).rename(outside)
    (tmp_path / "b" / ROLES_FILE).symlink_to(outside)
    with pytest.raises(tlb.BridgeError, match=f"{ROLES_FILE} resolves outside the bundle folder"):
        tlb.load(tmp_path / "b")
    doc = tmp_path / "d" / "m.json"
    tlb.export_torchlean(seed_mlp_bundle(), doc, inline_payload=False)
    side = doc.with_name("m.payload.safetensors")
    side.rename(tmp_path / "p.safetensors")
    side.symlink_to(tmp_path / "p.safetensors")
    with pytest.raises(tlb.BridgeError, match="resolves outside the document's folder"):
        tlb.load(doc)


@pytest.mark.parametrize("binding, message", [
    ({"key": "w", "node": 99, "role": "weight"}, "roles bind `w` to node 99, which is not in the graph"),
    ({"key": "w", "node": 1, "role": "evil"}, r"node 1 \(linear\), which has no role `evil`"),
    ({"key": "w", "node": 2, "role": "weight"}, r"node 2 \(relu\), which has no role `weight`"),
])
def test_roles_binding_what_the_graph_does_not_have_are_refused(tmp_path, binding, message):
    tlb.save(seed_mlp_bundle(), tmp_path / "b")
    _rewrite_listed(tmp_path / "b", ROLES_FILE, json.dumps([binding]))
    with pytest.raises(tlb.BridgeError, match=message):
        tlb.load(tmp_path / "b")


def _rewrite_listed(folder: Path, name: str, text: str) -> None:
    """Replace one bundle file and re-record it in the manifest, so only its content is wrong."""
    from exporters.folder import file_sha256
    (folder / name).write_text(text)
    manifest = json.loads((folder / MANIFEST_FILE).read_text())
    manifest["files"][name] = {"bytes": (folder / name).stat().st_size, "sha256": file_sha256(folder / name)}
    (folder / MANIFEST_FILE).write_text(json.dumps(manifest))


@pytest.mark.parametrize("name, text, message", [
    (ROLES_FILE, "[NaN]", "bundle roles .*roles.json: invalid JSON: NaN is not valid JSON"),
    (REPORT_FILE, "[" * 100_000 + "]" * 100_000, "bundle report .*report.json: nested too deeply"),
    (REPORT_FILE, '{"a": 1, "a": 2}', "report.json: invalid JSON: the name 'a' appears twice"),
    (GRAPH_FILE, None, "the name 'output_ids' appears twice in one object"),
])
def test_bundle_json_files_are_strict_and_named_in_errors(tmp_path, name, text, message):
    tlb.save(seed_mlp_bundle(), tmp_path / "b")
    if text is None:  # a second top-level output_ids after the first
        body = (tmp_path / "b" / GRAPH_FILE).read_text().rstrip().rstrip("}")
        text = body + ', "output_ids": [1]}'
    if name == REPORT_FILE and REPORT_FILE not in json.loads((tmp_path / "b" / MANIFEST_FILE).read_text())["files"]:
        pass
    _rewrite_listed(tmp_path / "b", name, text)
    with pytest.raises(tlb.BridgeError, match=message):
        tlb.load(tmp_path / "b")


def test_error_messages_are_bounded():
    e = tlb.BridgeError("x" * 1_000_000, source="s" * 10_000)
    assert len(str(e)) < 9000 and str(e).startswith("x" * 100) and "1000000 characters in all" in str(e)


def test_an_onnx_fold_that_exhausts_memory_is_a_bridge_error(monkeypatch):
    import importers.onnx.fold as fold
    from onnx import TensorProto, helper

    def exhausted(*args):
        raise MemoryError
    monkeypatch.setattr(fold, "_run_reference", exhausted)
    node = helper.make_node("ConstantOfShape", ["s"], ["y"], name="big")
    shape = helper.make_tensor("s", TensorProto.INT64, [1], [8])
    graph = helper.make_graph([node], "g", [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8])], [shape])
    with pytest.raises(tlb.BridgeError, match="folding its constant result at import time needs more memory"):
        tlb.import_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


def test_a_document_that_exhausts_memory_is_a_wire_error(monkeypatch):
    import torchlean_bridge.wire as wire

    def exhausted(*args, **kwargs):
        raise MemoryError
    monkeypatch.setattr(wire, "_top_level_unique", exhausted)
    with pytest.raises(WireError, match=r"the document \(2 bytes\) needs more memory to parse"):
        wire.loads_document("[]")


@pytest.mark.parametrize("start, limit, delta, message", [
    (0.0, 1.0, 1e-12, r"has \d{13} elements, above the limit"),
    (0.0, 1.0, 0.0, "delta is 0, so the range has no end"),
])
def test_onnx_range_of_float_initializers_is_folded_or_refused_for_its_size(start, limit, delta, message):
    import onnx
    from onnx import TensorProto, helper
    inits = [helper.make_tensor(n, TensorProto.FLOAT, [], [v]) for n, v in (("a", start), ("b", limit), ("d", delta))]
    graph = helper.make_graph([helper.make_node("Range", ["a", "b", "d"], ["y"], name="r")], "g", [],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(tlb.BridgeError, match=message):
        tlb.import_onnx(model)
    inits[2] = helper.make_tensor("d", TensorProto.FLOAT, [], [0.25])  # a sane step folds
    graph = helper.make_graph(graph.node, "g", [], graph.output, inits)
    b = tlb.import_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    np.testing.assert_array_equal(tlb.evaluate(b.graph, b.payload, [])[0], [0.0, 0.25, 0.5, 0.75])


@pytest.mark.parametrize("form", ["flat", "coordinates"])
def test_onnx_sparse_initializers_are_read_dense(form):
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper
    dense = np.zeros((3, 4), np.float32)
    dense[0, 1], dense[2, 3], dense[1, 0] = 2.5, -1.0, 4.0
    nz = np.argwhere(dense != 0)
    idx = np.ravel_multi_index(nz.T, dense.shape) if form == "flat" else nz
    sparse = helper.make_sparse_tensor(numpy_helper.from_array(dense[dense != 0], "W"),
                                       numpy_helper.from_array(idx.astype(np.int64), "W_idx"), [3, 4])
    graph = helper.make_graph([helper.make_node("Add", ["x", "W"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4])], sparse_initializer=[sparse])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = np.random.default_rng(0).random((3, 4)).astype(np.float32)
    b = tlb.import_onnx(model)
    ours = tlb.evaluate(b.graph, b.payload, [x], dtype="float32")[0]
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_array_equal(ours, want)
    bad = helper.make_sparse_tensor(numpy_helper.from_array(dense[dense != 0], "W"),
                                    numpy_helper.from_array(np.array([0, 1, 99], np.int64), "W_idx"), [3, 4])
    graph = helper.make_graph(graph.node, "g", graph.input, graph.output, sparse_initializer=[bad])
    with pytest.raises(tlb.BridgeError, match="indices \\[3\\] do not address 3 values inside \\[3, 4\\]"):
        tlb.import_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


def test_an_inline_payload_beyond_a_readable_document_is_refused_before_it_is_built(monkeypatch):
    """Grouped conv weights are written dense ([out, in, *k]); a depthwise conv of C channels is C
    times its weights. The count is checked before any dense array exists."""
    import torch
    import torchlean_bridge.wire as wire
    m = torch.nn.Conv2d(64, 64, 3, groups=64).eval()
    b = tlb.import_fx(m, (torch.zeros(1, 64, 5, 5),))
    monkeypatch.setattr(wire, "MAX_INLINE_NUMBERS", 64 * 9 * 64 - 1)  # the dense weight, not the stored 576
    with pytest.raises(tlb.BridgeError, match=r"an inline payload would write \d+ numbers .*inline_payload=False"):
        tlb.export_torchlean(b, None)
    monkeypatch.setattr(wire, "MAX_INLINE_NUMBERS", 64 * 9 * 64 + 64)
    assert tlb.export_torchlean(b, None)["nodes"]



def test_crown_refuses_a_max_pool_window_table_beyond_the_memory_budget(monkeypatch):
    pool = dict(spatial_rank=1, kernel=(3000,), stride=(1,), padding=(0,))
    g = _graph(Node(0, [], "input", (1, 1, 6000)), Node(1, [0], "max_pool", (1, 1, 3001), pool))
    x = np.zeros((1, 1, 6000))
    monkeypatch.setenv("TLB_MEMORY_BUDGET", str(2 ** 26))
    with pytest.raises(tlb.BridgeError, match=r"linear_bounds: node 1 \(max_pool\): its max-pool relaxation needs "
                                              r"\d+\.\d\d GiB, above the working-memory budget of 0\.06 GiB"):
        tlb.linear_bounds(g, tlb.Payload({}), x, x + 1, method="crown")
    monkeypatch.setenv("TLB_MEMORY_BUDGET", "64 MiB")
    with pytest.raises(tlb.BridgeError, match="TLB_MEMORY_BUDGET='64 MiB': expected a whole number of bytes"):
        tlb.linear_bounds(g, tlb.Payload({}), x, x + 1, method="crown")
    monkeypatch.setenv("TLB_MEMORY_BUDGET", str(2 ** 30))  # a small pool within the budget is bounded
    pool = dict(spatial_rank=1, kernel=(30,), stride=(1,), padding=(0,))
    g = _graph(Node(0, [], "input", (1, 1, 60)), Node(1, [0], "max_pool", (1, 1, 31), pool))
    ((lo, hi),) = tlb.linear_bounds(g, tlb.Payload({}), np.zeros((1, 1, 60)), np.ones((1, 1, 60)), method="crown")
    assert np.all(lo <= 0) and np.all(hi >= 1)


def test_evaluation_that_exhausts_memory_names_the_node(tmp_path):
    """Within every size check (2^30 elements < the 2^31 limit), but above an address-space cap (8 GiB of
    float64 tanh results under a 3 GiB cap)."""
    import subprocess
    import sys
    code = """
import resource, numpy as np, torchlean_bridge as tlb
from torchlean_bridge import Node, Graph
resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
g = Graph([Node(0, [], "input", (1,)), Node(1, [0], "broadcast_to", (1 << 15, 1 << 15), {"from_shape": (1,),
          "to_shape": (1 << 15, 1 << 15)}), Node(2, [1], "tanh", (1 << 15, 1 << 15))], [0], [2])
try:
    tlb.evaluate(g, tlb.Payload({}), [np.ones(1)])
except tlb.BridgeError as e:
    print("refused:", e)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "refused: IR eval: node 2: evaluating it needs more memory than is available" in out.stdout, out.stderr


def test_interval_cast_to_int64_refuses_what_evaluation_refuses():
    g = Graph([Node(0, [], "input", (2,)), Node(1, [0], "cast", (2,), {"dtype": "int64"}, "int64")], [0], [1])
    lo, hi = tlb.interval_bounds(g, tlb.Payload({}), np.array([0.5, -2.7]), np.array([3.7, -1.2]))[1]
    assert lo.tolist() == [0, -2] and hi.tolist() == [3, -1]
    for top in (1e30, np.inf, 2.0 ** 63):
        with pytest.raises(tlb.BridgeError, match="cast: value .* outside the int64 range"):
            tlb.evaluate(g, tlb.Payload({}), [np.array([0.0, top])])
        with pytest.raises(tlb.BridgeError, match="past the int64 range cannot be converted to int64"):
            tlb.interval_bounds(g, tlb.Payload({}), np.array([0.0, 0.0]), np.array([1.0, top]))


@pytest.mark.parametrize("node_text, message", [
    ('{"id": 1, "kind": "relu", "kind": "tanh", "parents": [0], "shape": [2]}',
     r"the name 'kind' appears twice in one object \(node\[1\]\)"),
    ('{"id": 1, "id": 0, "kind": "relu", "parents": [0], "shape": [2]}', "the name 'id' appears twice in one object$"),
    ('{"id": 1, "kind": "relu", "parents": [0], "shape": [2], "shape": [3]}', r"'shape' appears twice .*\(node\[1\]\)"),
    ('{"id": 1, "kind": "softmax", "parents": [0], "shape": [2], "axis": 1, "axis": 0}',
     r"the name 'axis' appears twice in one object \(node\[1\]\)"),
])
def test_a_name_repeated_inside_a_node_is_refused(tmp_path, node_text, message):
    text = ('{"format": "torchlean.ir.v1", "input_id": 0, "output_ids": [1], "nodes": ['
            '{"id": 0, "kind": "input", "parents": [], "shape": [2]}, ' + node_text + ']}')
    path = tmp_path / "g.json"
    path.write_text(text)
    for source in (path, text):
        with pytest.raises(WireError, match=message):
            tlb.load_graph(source)
    tlb.load_graph(text.replace('"kind": "tanh", ', "").replace('"id": 0, "kind": "relu"', '"kind": "relu"')
                   .replace(', "shape": [3]', "").replace('"axis": 1, ', ""))  # without the repeat it loads
