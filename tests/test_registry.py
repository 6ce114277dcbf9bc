"""The op registry: every v1 kind with its exact spelling and arity, every op with a shape rule."""

import subprocess
import sys

import pytest

from torchlean_bridge.errors import ShapeRuleError
from torchlean_bridge.ops import REGISTRY, V1_KINDS
from tests.conftest import ROOT

SPEC_ARITY = {  # spec section 2.1, in OpTag.all order
    "input": (0, 0), "const": (0, 0), "custom": (0, None), "permute": (1, 1), "transpose": (1, 1),
    "detach": (1, 1), "rand_uniform": (0, 0), "bernoulli_mask": (1, 1), "add": (2, 2), "sub": (2, 2),
    "mul_elem": (2, 2), "abs": (1, 1), "sqrt": (1, 1), "inv": (1, 1), "max_elem": (2, 2), "min_elem": (2, 2),
    "max_pool": (1, 1), "avg_pool": (1, 1), "broadcast_to": (1, 1), "reduce_sum": (1, 1), "reduce_mean": (1, 1),
    "sum": (1, 1), "matmul": (2, 2), "linear": (1, 1), "conv": (1, 1), "batch_norm_eval": (1, 1), "relu": (1, 1),
    "tanh": (1, 1), "sigmoid": (1, 1), "exp": (1, 1), "log": (1, 1), "sin": (1, 1), "cos": (1, 1),
    "softplus": (1, 1), "safe_log": (2, 2), "softmax": (1, 1), "hard_masked_softmax": (1, 1),
    "layernorm": (1, 1), "reshape": (1, 1), "flatten": (1, 1), "concat": (2, None), "mse_loss": (2, 2),
}

REQUIRED_EXT = ["div", "neg", "pow", "erf", "gelu", "silu", "leaky_relu", "elu", "clamp", "log_softmax", "where",
                "gather", "slice", "pad", "squeeze", "unsqueeze", "expand", "reduce_max", "reduce_min", "argmax",
                "cast", "reduce_sum_axes", "reduce_mean_axes"]


def test_all_42_v1_kinds_with_spec_arity():
    assert len(SPEC_ARITY) == 42 and tuple(SPEC_ARITY) == V1_KINDS
    for kind, (lo, hi) in SPEC_ARITY.items():
        spec = REGISTRY[kind]
        assert spec.dialect == "v1" and spec.kind == kind
        assert (spec.min_parents, spec.max_parents) == (lo, hi), kind


def test_ext_dialect_covers_what_real_models_need():
    for kind in REQUIRED_EXT:
        assert kind in REGISTRY and not REGISTRY[kind].dialect == "v1", kind


def test_every_op_has_a_shape_rule_and_wire_spelling():
    for kind, spec in REGISTRY.items():
        assert callable(spec.infer) and spec.kind == kind and kind.isidentifier()
        assert spec.dialect in ("v1", "v1-wire", "ext")
        assert all(a.name.isidentifier() for a in spec.attrs), kind
    # the rules run: a unary op keeps its parent's shape, a reduction removes an axis
    assert REGISTRY["gelu"].infer(REGISTRY["gelu"].defaults(), [(2, 3)], ()) == (2, 3)
    assert REGISTRY["reduce_max"].infer({"axes": (1,), "keepdim": False}, [(2, 3)], ()) == (2,)


@pytest.mark.parametrize("kind, attrs, parents, declared, message", [
    ("add", {}, [(2, 3), (3,)], (2, 3), "add: shape mismatch: [2, 3] vs [3]"),
    ("permute", {"perm": (0, 0)}, [(2, 3)], (2, 3), "permute: invalid permutation #[0, 0] for shape [2, 3]"),
    ("transpose", {"axis1": 0, "axis2": 2}, [(2, 3)], (2, 3), "transpose: axis 2 out of range for rank 2"),
    ("broadcast_to", {"from_shape": (3,), "to_shape": (2, 4)}, [(3,)], (2, 4),
     "broadcastTo: invalid broadcast from [3] to [2, 4]"),
    ("reduce_sum", {"axis": 1}, [(2, 0)], (2,), "invalid or empty reduction axis 1 for shape [2, 0]"),
    ("matmul", {}, [(2, 3), (4, 5)], (2, 5), "matmul: inner dims mismatch: 3 vs 4"),
    ("matmul", {}, [(2, 2, 3), (4, 3, 5)], (2, 5), "matmul: incompatible batch dimensions 2 and 4"),
    ("matmul", {}, [(), (3,)], (), "matmul: expected non-scalar inputs, got [] and [3]"),
    ("softmax", {"axis": 2}, [(2, 3)], (2, 3), "invalid axis 2 for rank 2"),
    ("reshape", {"in_shape": (2, 3), "out_shape": (5,)}, [(2, 3)], (5,), "reshape: numel mismatch: 6 vs 5"),
    ("concat", {"axis": 0}, [(2, 3), (2, 4)], (4, 3), "concat: non-axis dim mismatch at axis 1: expected 3, got 4"),
    ("safe_log", {}, [(2,), (1,)], (2,), "safe_log: epsilon must be scalar, got [1]"),
    ("mse_loss", {}, [(2,), (3,)], (), "mse_loss: yhat/target shape mismatch: [2] vs [3]"),
    ("conv", dict(spatial_rank=1, kernel=(5,), stride=(1,), padding=(0,), padding_after=(0,), dilation=(1,), groups=1,
                  channel_axis=0, in_channels=2, out_channels=4), [(2, 3)], (4, 1),
     "conv: axis 1 window does not fit padded input: input=3, padding=(0, 0), effectiveKernel=5"),
    ("conv", dict(spatial_rank=1, kernel=(1,), stride=(1,), padding=(0,), padding_after=(0,), dilation=(1,), groups=3,
                  channel_axis=0, in_channels=2, out_channels=3), [(2, 3)], (3, 3),
     "conv: in_channels=2 is not divisible by groups=3"),
    ("batch_norm_eval", {"channel_axis": 1, "channels": 4}, [(2, 3)], (2, 3),
     "batch_norm_eval: channel mismatch: op=4 vs input=3"),
    ("max_pool", dict(spatial_rank=3, kernel=(1, 1, 1), stride=(1, 1, 1), padding=(0, 0, 0)), [(2, 3)], (2, 3),
     "max_pool: kernel rank 3 exceeds input rank 2"),
    ("linear", {}, [(2, 3)], (3, 4), "linear: leading dimensions must be preserved: input=[2, 3], outShape=[3, 4]"),
    ("layernorm", {"axis": 1}, [(2, 0)], (2, 0), "layernorm: embedDim must be > 0"),
])
def test_rule_messages_are_torchleans(kind, attrs, parents, declared, message):
    spec = REGISTRY[kind]
    with pytest.raises(ShapeRuleError) as e:
        spec.infer({**spec.defaults(), **attrs}, parents, declared)
    assert e.value.message == message


def test_v1_pool_zero_extent_quirk_and_conv_geometry():
    pool = REGISTRY["avg_pool"]
    attrs = dict(spatial_rank=2, kernel=(2, 2), stride=(2, 2), padding=(2, 0))
    assert pool.infer(attrs, [(1, 3, 4, 4)], ()) == (1, 3, 0, 2)  # pad > k // 2 -> zero extent
    conv = REGISTRY["conv"]
    attrs = dict(spatial_rank=2, kernel=(3, 3), stride=(2, 1), padding=(1, 0), padding_after=(2, 0),
                 dilation=(1, 2), groups=2, channel_axis=1, in_channels=4, out_channels=6)
    assert conv.infer(attrs, [(8, 4, 10, 9)], ()) == (8, 6, 6, 5)


def test_docs_ops_md_is_current():
    import importlib.util
    spec = importlib.util.spec_from_file_location("make_ops_md", ROOT / "docs" / "make_ops_md.py")
    generator = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generator)
    assert (ROOT / "docs" / "ops.md").read_text() == generator.render(), \
        "docs/ops.md is stale: run python docs/make_ops_md.py and commit it"

def test_importing_the_package_loads_neither_torch_nor_onnx():
    code = ("import sys, torchlean_bridge as t; t.load_graph; t.check; "
            "print(sorted(m for m in ('torch', 'onnx', 'onnxruntime', 'safetensors') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
