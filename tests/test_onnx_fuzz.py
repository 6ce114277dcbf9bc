"""Mutated ONNX models only ever raise BridgeError from tlb.import_onnx (or import cleanly).

Two small campaigns run in a child process under a 3 GiB address-space cap and a per-case alarm:
byte mutation of serialized models (flips, insertions, deletions) and structural mutation (an int
attribute, an integer initializer entry or an input extent set to an extreme value). Any other
exception, a timeout or a crash of the child fails the test with the cases that caused it.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import traceback
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
EXTREMES = [-2**40, -3, -1, 0, 1, 2, 3, 7, 10**9]


def seed_models() -> list:
    import onnx
    from onnx import TensorProto as TP
    from onnx import helper as h
    from onnx import numpy_helper as nh
    r = np.random.default_rng(0)
    conv = h.make_graph(
        [h.make_node("Conv", ["x", "W", "B"], ["c"], pads=[1, 1, 1, 1]), h.make_node("Relu", ["c"], ["r"]),
         h.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
         h.make_node("Reshape", ["p", "s"], ["f"]), h.make_node("Gemm", ["f", "G", "gb"], ["y"], transB=1),
         h.make_node("Softmax", ["y"], ["z"], axis=1)], "g",
        [h.make_tensor_value_info("x", TP.FLOAT, ["N", 3, 4, 4])], [h.make_tensor_value_info("z", TP.FLOAT, None)],
        [nh.from_array(r.standard_normal((4, 3, 3, 3)).astype(np.float32), "W"),
         nh.from_array(np.zeros(4, np.float32), "B"), nh.from_array(np.array([1, 16]), "s"),
         nh.from_array(r.standard_normal((5, 16)).astype(np.float32), "G"),
         nh.from_array(np.ones(5, np.float32), "gb")])
    layout = h.make_graph(
        [h.make_node("Unsqueeze", ["x"], ["u"], axes=[0]), h.make_node("Pad", ["u"], ["p"], pads=[0, 1, 0, 0, 1, 0], mode="reflect"),
         h.make_node("Split", ["p"], ["a", "b"], axis=2), h.make_node("Concat", ["b", "a"], ["q"], axis=2),
         h.make_node("Squeeze", ["q"], ["sq"], axes=[0]), h.make_node("Transpose", ["sq"], ["t"], perm=[1, 0]),
         h.make_node("Slice", ["t"], ["z"], starts=[0], ends=[2], axes=[0])], "g",
        [h.make_tensor_value_info("x", TP.FLOAT, [3, 4])], [h.make_tensor_value_info("z", TP.FLOAT, None)])
    shapes = h.make_graph(
        [h.make_node("Range", ["a", "b", "c"], ["rg"]), h.make_node("Cast", ["rg"], ["rf"], to=TP.FLOAT),
         h.make_node("Add", ["x", "rf"], ["y"]), h.make_node("ReduceSum", ["y", "ax"], ["z"], keepdims=1)], "g",
        [h.make_tensor_value_info("x", TP.FLOAT, [2, 3])], [h.make_tensor_value_info("z", TP.FLOAT, None)],
        [nh.from_array(np.array(0), "a"), nh.from_array(np.array(3), "b"), nh.from_array(np.array(1), "c"),
         nh.from_array(np.array([1]), "ax")])
    return [h.make_model(conv, opset_imports=[h.make_opsetid("", 13)]),
            h.make_model(layout, opset_imports=[h.make_opsetid("", 9)]),
            h.make_model(shapes, opset_imports=[h.make_opsetid("", 13)])]


def byte_mutant(rng: random.Random, data: bytes) -> bytes:
    b = bytearray(data)
    for _ in range(rng.choice([1, 1, 2, 4, 8])):
        pos, op = rng.randrange(len(b)), rng.random()
        if op < 0.6:
            b[pos] = rng.randrange(256)
        elif op < 0.8:
            b.insert(pos, rng.randrange(256))
        else:
            del b[pos]
    return bytes(b)


def structural_mutant(rng: random.Random, model):
    import onnx
    m = onnx.ModelProto()
    m.CopyFrom(model)
    node = rng.choice(list(m.graph.node))
    ints = [a for a in node.attribute if a.type in (onnx.AttributeProto.INT, onnx.AttributeProto.INTS)]
    inits = [t for t in m.graph.initializer if t.data_type == onnx.TensorProto.INT64]
    choice = rng.random()
    if ints and choice < 0.5:
        a = rng.choice(ints)
        if a.type == onnx.AttributeProto.INT:
            a.i = rng.choice(EXTREMES)
        elif a.ints:
            a.ints[rng.randrange(len(a.ints))] = rng.choice(EXTREMES)
    elif inits and choice < 0.8:
        t = rng.choice(inits)
        arr = onnx.numpy_helper.to_array(t).copy()
        arr.reshape(-1)[rng.randrange(arr.size)] = rng.choice(EXTREMES)
        t.CopyFrom(onnx.numpy_helper.from_array(arr, t.name))
    else:
        dims = list(m.graph.input[0].type.tensor_type.shape.dim)
        rng.choice(dims).dim_value = rng.choice([0, 1, 2, 5, 10**6, 10**12])
    return m.SerializeToString()


def campaign(seed: int, cases: int) -> list[dict]:
    """Problems found: a non-BridgeError exception or a timeout, with the case's bytes (hex)."""
    import signal

    import torchlean_bridge as tlb

    def alarm(*_):
        raise TimeoutError("case took over 10 s")
    signal.signal(signal.SIGALRM, alarm)
    rng = random.Random(seed)
    models = seed_models()
    problems = []
    for i in range(cases):
        model = rng.choice(models)
        data = byte_mutant(rng, model.SerializeToString()) if i % 2 else structural_mutant(rng, model)
        signal.alarm(10)
        try:
            tlb.import_onnx(data)
        except tlb.BridgeError:
            pass
        except Exception as e:  # noqa: BLE001 - what the test looks for
            last = traceback.extract_tb(e.__traceback__)[-1]
            problems.append({"error": f"{type(e).__name__}: {e}"[:300], "at": f"{last.filename}:{last.lineno}",
                             "case": data.hex()})
        finally:
            signal.alarm(0)
    return problems


@pytest.mark.parametrize("seed", [0, 1])
def test_mutated_onnx_models_raise_only_bridge_errors(seed):
    child = subprocess.run([sys.executable, __file__, str(seed), "300"], cwd=ROOT, capture_output=True, text=True,
                           timeout=600)
    assert child.returncode == 0, f"the fuzz child died ({child.returncode}): {child.stderr[-2000:]}"
    problems = json.loads(child.stdout.splitlines()[-1])
    assert not problems, "\n".join(f"{p['error']} at {p['at']}" for p in problems)


if __name__ == "__main__":
    import resource
    resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
    sys.path.insert(0, str(ROOT))
    print(json.dumps(campaign(int(sys.argv[1]), int(sys.argv[2]))))
