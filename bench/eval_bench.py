"""Evaluator speed against onnxruntime and onnx's ReferenceEvaluator (a benchmark, not a test).

Builds three models in code (a ResNet-style CNN at batch 1 x 3x224x224, a 4-layer MLP at batch 64 and
width 1024, a transformer encoder at sequence 128 and width 256), exports each to ONNX, imports it
with ``torchlean_bridge.import_onnx``, checks that all runners agree, and prints per model the median
wall time of several runs in one process: our float32 and float64 evaluation, onnxruntime, and the
ReferenceEvaluator, with the ratios ours/onnxruntime and ReferenceEvaluator/ours.

    python bench/eval_bench.py [--runs 7] [--models cnn,mlp,transformer] [--threads N] [--no-slow-peers]

More models: ``squeezenet``, ``resnet50`` and ``convnext`` (torchvision's ConvNeXt-T: depthwise 7x7;
random weights) and ``convmixer`` (ConvMixer-256/8: depthwise 9x9 convolutions); ``--no-slow-peers`` skips the ReferenceEvaluator and
the exact mode on them. The ``torch`` column is the model's own forward (same threads), ``f32/torch``
our float32 time against it.

``--threads`` (default 1) fixes the BLAS thread count (OpenBLAS/OpenMP, set before numpy loads) and
onnxruntime's intra-op threads to the same number, so both sides get the same cores; ``--threads 0``
leaves each library its own default. Runners are interleaved round by round so background load
affects them alike. (On a machine whose cores are busy, OpenBLAS's spinning worker threads can make
multi-threaded BLAS many times slower than one thread; onnxruntime's pool degrades more gently.)

The ``floor`` columns are the median time of the model's matrix products alone: every linear,
matmul and convolution GEMM (im2col shapes) on prebuilt operands of the same shapes, in float32 and
in float64. No evaluator built on numpy's BLAS, ours or the ReferenceEvaluator, can run the model
faster than that; ``ref/floor`` is how far the ReferenceEvaluator is from it.

Our float32 and float64 runs evaluate a prepared graph (``tlb.prepare(g, payload).evaluate``): graph
validation and weight conversion (with the depthwise path's band matrices) happen once up front, as
onnxruntime does at session creation.

The ``exact`` column is the exact float64 mode (``evaluate(..., exact=True)``: TorchLean's sequential
folds from +0.0 and C libm, bit-identical to TorchLean's ``Graph.denoteAll`` at Float), ``exact/f64``
its ratio to the default float64 evaluator, and ``ulps`` the largest distance between the two modes'
outputs in ulps of the output's largest magnitude.

Targets (issue 3): float32 within 2x of onnxruntime on the CNN and MLP, >= 10x faster than the
ReferenceEvaluator on all three, float64 within 3x of onnxruntime; (issue 20) exact within 10x of
the default float64 evaluator.
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def resnet_cnn():
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.down = None
            if stride != 1 or cin != cout:
                self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x):
            y = torch.relu(self.bn1(self.conv1(x)))
            y = self.bn2(self.conv2(y))
            return torch.relu(y + (x if self.down is None else self.down(x)))

    model = nn.Sequential(
        nn.Conv2d(3, 32, 7, 2, 3, bias=False), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(3, 2, 1),
        Block(32, 32, 1), Block(32, 64, 2), Block(64, 128, 2), Block(128, 256, 2),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(256, 1000))
    _randomize_batch_norm(model)
    return model, torch.randn(1, 3, 224, 224)


def mlp():
    import torch
    from torch import nn
    model = nn.Sequential(nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                          nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1024))
    return model, torch.randn(64, 1024)


def transformer():
    """Two post-norm encoder layers (4 heads, GELU feed-forward), written out with Linear/LayerNorm/softmax
    (the TorchScript exporter cannot export nn.TransformerEncoderLayer's attention in this torch)."""
    import torch
    from torch import nn

    class EncoderLayer(nn.Module):
        def __init__(self, d: int, heads: int, ff: int) -> None:
            super().__init__()
            self.heads, self.scale = heads, (d // heads) ** -0.5
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.ff1, self.ff2 = nn.Linear(d, ff), nn.Linear(ff, d)
            self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)

        def forward(self, x):
            b, s, d = x.shape
            q, k, v = (t.reshape(b, s, self.heads, d // self.heads).transpose(1, 2)
                       for t in self.qkv(x).split(d, dim=-1))
            attention = torch.softmax(q @ k.transpose(-2, -1) * self.scale, dim=-1)
            y = (attention @ v).transpose(1, 2).reshape(b, s, d)
            x = self.norm1(x + self.proj(y))
            return self.norm2(x + self.ff2(torch.nn.functional.gelu(self.ff1(x))))

    model = nn.Sequential(EncoderLayer(256, 4, 1024), EncoderLayer(256, 4, 1024))
    return model, torch.randn(1, 128, 256)


def _randomize_batch_norm(model) -> None:
    import torch
    from torch import nn
    g = torch.Generator().manual_seed(0)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.copy_(torch.randn(m.num_features, generator=g) * 0.1)
            m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)


def _torchvision():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from torchvision_cpu import import_torchvision
    tv = import_torchvision()
    if tv is None:
        raise SystemExit("torchvision is not installed: the squeezenet and resnet50 models need it")
    return tv


def squeezenet():
    """torchvision's SqueezeNet 1.0 (random weights): three 3x3 stride-2 ceil-mode max pools."""
    import torch
    torch.manual_seed(0)
    return _torchvision().models.squeezenet1_0(weights=None), torch.randn(1, 3, 224, 224)


def resnet50():
    import torch
    torch.manual_seed(0)
    model = _torchvision().models.resnet50(weights=None)
    _randomize_batch_norm(model)
    return model, torch.randn(1, 3, 224, 224)


def convmixer():
    """ConvMixer-256/8 (patch 7, kernel 9) at 224x224: depthwise 9x9 convolutions, GELU, batch norm."""
    import torch
    from torch import nn

    class Residual(nn.Module):
        def __init__(self, fn: nn.Module) -> None:
            super().__init__()
            self.fn = fn

        def forward(self, x):
            return self.fn(x) + x

    d, k = 256, 9
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, d, 7, stride=7), nn.GELU(), nn.BatchNorm2d(d),
                          *[nn.Sequential(Residual(nn.Sequential(nn.Conv2d(d, d, k, groups=d, padding=k // 2),
                                                                 nn.GELU(), nn.BatchNorm2d(d))),
                                          nn.Conv2d(d, d, 1), nn.GELU(), nn.BatchNorm2d(d)) for _ in range(8)],
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(d, 1000))
    _randomize_batch_norm(model)
    return model, torch.randn(1, 3, 224, 224)


def convnext():
    """torchvision's ConvNeXt-T (random weights): depthwise 7x7 convolutions at 56, 28, 14 and 7 cells wide."""
    import torch
    torch.manual_seed(0)
    return _torchvision().models.convnext_tiny(weights=None), torch.randn(1, 3, 224, 224)


MODELS: dict[str, Callable] = {"cnn": resnet_cnn, "mlp": mlp, "transformer": transformer, "squeezenet": squeezenet,
                               "resnet50": resnet50, "convmixer": convmixer, "convnext": convnext}


def export_onnx(model, example) -> bytes:
    import torch
    buf = io.BytesIO()
    with torch.no_grad():
        torch.onnx.export(model.eval(), (example,), buf, input_names=["x"], output_names=["y"], opset_version=17,
                          dynamo=False)
    return buf.getvalue()


def median_times(runners: dict[str, Callable[[], object]], runs: dict[str, int]) -> dict[str, float]:
    """Median wall time per runner; one warm-up each, then rounds that interleave the runners."""
    times: dict[str, list[float]] = {name: [] for name in runners}
    for fn in runners.values():
        fn()
    for r in range(max(runs.values())):
        for name, fn in runners.items():
            if r < runs[name]:
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}


def gemm_operands(g, payload, x, dtype: str) -> list[tuple]:
    """(left, right) operand pairs of every matrix product the model's evaluation performs, as
    ``semantics.conv.conv_nd`` and the linear/matmul rules shape them, filled with random values."""
    import math

    import numpy as np

    import torchlean_bridge as tlb
    rng = np.random.default_rng(0)
    values = tlb.evaluate(g, payload, x, dtype="float64", all_nodes=True)

    def rand(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(dtype)

    pairs = []
    for node in g.nodes:
        a = node.attrs
        if node.kind == "linear":
            x_shape = values[node.parents[0]].shape
            pairs.append((rand(math.prod(x_shape[:-1]), x_shape[-1]), rand(node.out_shape[-1], x_shape[-1]).T))
        elif node.kind == "matmul":
            pairs.append((rand(*values[node.parents[0]].shape), rand(*values[node.parents[1]].shape)))
        elif node.kind == "conv":
            ca, groups = a["channel_axis"], a["groups"]
            n = math.prod(node.out_shape[:ca])
            depth = a["in_channels"] // groups * math.prod(a["kernel"])
            length = math.prod(node.out_shape[ca + 1:])
            pairs.append((rand(groups, a["out_channels"] // groups, depth), rand(n, groups, depth, length)))
    return pairs


def run_gemms(pairs: list[tuple]) -> None:
    import numpy as np
    for left, right in pairs:
        np.matmul(left, right)


def bench_model(name: str, runs: int, threads: int | None, slow_peers: bool = True) -> dict[str, float]:
    import numpy as np
    import onnx
    import onnxruntime as ort
    import torch
    from onnx.reference import ReferenceEvaluator

    import torchlean_bridge as tlb

    model, example = MODELS[name]()
    proto = onnx.load_from_string(export_onnx(model, example))
    bundle = tlb.import_onnx(proto)
    x = example.numpy()
    g, payload = bundle.graph, bundle.payload

    opts = ort.SessionOptions()
    if threads:
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
    session = ort.InferenceSession(proto.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    reference = ReferenceEvaluator(proto)

    # like an onnxruntime session, convert the weights to the evaluation domain once, up front
    p32, p64 = payload.astype("float32"), payload.astype("float64")
    ours32 = tlb.evaluate(g, p32, x, dtype="float32")[0]
    ours64 = tlb.evaluate(g, p64, x, dtype="float64")[0]
    ort_out = session.run(None, {"x": x})[0]
    scale = float(np.max(np.abs(ort_out)))
    err32 = float(np.max(np.abs(ours32 - ort_out))) / scale
    err64 = float(np.max(np.abs(ours64 - ort_out))) / scale

    ulps = float("nan")
    if slow_peers:
        exact = tlb.evaluate(g, p64, x, dtype="float64", exact=True)[0]
        ulps = float(np.max(np.abs(exact - ours64)) / np.spacing(np.max(np.abs(exact))))
    gemms32, gemms64 = gemm_operands(g, p64, x, "float32"), gemm_operands(g, p64, x, "float64")
    if threads:
        torch.set_num_threads(threads)
    xt = torch.from_numpy(x)
    prepared32, prepared64 = tlb.prepare(g, p32), tlb.prepare(g, p64)
    runners = {"ours32": lambda: prepared32.evaluate(x, dtype="float32"),
               "ours64": lambda: prepared64.evaluate(x, dtype="float64"),
               "exact": lambda: tlb.evaluate(g, p64, x, dtype="float64", check=False, exact=True),
               "floor32": lambda: run_gemms(gemms32),
               "floor64": lambda: run_gemms(gemms64),
               "ort": lambda: session.run(None, {"x": x}),
               "torch": lambda: _torch_forward(model, xt),
               "ref": lambda: reference.run(None, {"x": x})}
    counts = {"ours32": runs, "ours64": runs, "exact": max(1, runs // 2), "floor32": runs, "floor64": runs,
              "ort": runs, "torch": runs, "ref": max(1, runs // 3)}
    if not slow_peers:
        for slow in ("exact", "ref"):
            del runners[slow], counts[slow]
    t = median_times(runners, counts)
    t.setdefault("exact", float("nan"))
    t.setdefault("ref", float("nan"))
    return {**t, "err32": err32, "err64": err64, "nodes": len(g), "ulps": ulps}


def _torch_forward(model, x):
    import torch
    with torch.no_grad():
        return model(x)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=7, help="timed runs per runner (median reported)")
    parser.add_argument("--models", default="cnn,mlp,transformer",
                        help="comma-separated: cnn, mlp, transformer, squeezenet, resnet50, convnext (torchvision), convmixer")
    parser.add_argument("--no-slow-peers", action="store_true",
                        help="skip the ReferenceEvaluator and the exact mode (minutes on resnet50)")
    parser.add_argument("--threads", type=int, default=1,
                        help="BLAS and onnxruntime intra-op threads (default 1; 0 = each library's own default)")
    args = parser.parse_args(argv)
    if args.threads:
        if "numpy" in sys.modules:
            raise SystemExit("--threads must be applied before numpy is imported")
        for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ[var] = str(args.threads)
    header = (f"{'model':<12}{'nodes':>6}{'ours f32':>11}{'ours f64':>11}{'ort':>10}{'ref eval':>11}"
              f"{'floor f32':>11}{'floor f64':>11}{'f32/ort':>9}{'f64/ort':>9}{'ref/f32':>9}{'ref/f64':>9}"
              f"{'ref/floor':>10}{'err f32':>10}{'err f64':>10}{'exact':>11}{'exact/f64':>10}{'ulps':>7}"
              f"{'torch':>10}{'f32/torch':>10}")
    print(header)
    for name in args.models.split(","):
        r = bench_model(name, args.runs, args.threads, not args.no_slow_peers)
        ms = {k: r[k] * 1e3 for k in ("ours32", "ours64", "ort", "ref", "floor32", "floor64", "exact")}
        print(f"{name:<12}{r['nodes']:>6}{ms['ours32']:>9.1f}ms{ms['ours64']:>9.1f}ms{ms['ort']:>8.1f}ms"
              f"{ms['ref']:>9.1f}ms{ms['floor32']:>9.1f}ms{ms['floor64']:>9.1f}ms"
              f"{r['ours32'] / r['ort']:>9.2f}{r['ours64'] / r['ort']:>9.2f}"
              f"{r['ref'] / r['ours32']:>9.1f}{r['ref'] / r['ours64']:>9.1f}{r['ref'] / r['floor32']:>10.1f}"
              f"{r['err32']:>10.1e}{r['err64']:>10.1e}{ms['exact']:>9.1f}ms{r['exact'] / r['ours64']:>10.1f}"
              f"{r['ulps']:>7.0f}{r['torch'] * 1e3:>8.1f}ms{r['ours32'] / r['torch']:>10.2f}", flush=True)
    print(f"times: median wall clock (threads: {args.threads or 'library default'}); "
          "floor: the model's GEMMs alone on numpy's BLAS (no numpy evaluator can be faster); "
          "err: max |ours - onnxruntime| / max |onnxruntime|")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
