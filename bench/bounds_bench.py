"""IBP and CROWN speed and tightness against auto_LiRPA (a benchmark peer only).

Models: a 784-1024-1024-10 ReLU MLP, a CNN (1x28x28: conv 8 k4 s2, relu, conv 16 k4 s2, relu,
linear 100, relu, linear 10), a residual CNN (conv 8 k4 s2, relu, [conv 8 k3, relu, conv 8 k3]
+ skip, relu, linear 10), and smooth activations: a 100-256-256-10 MLP with relu then tanh, a CNN
(3x32x32: conv 8 k4 s2, relu, conv 16 k4 s2, sigmoid, linear 10), 100-256-256-10 GELU and SiLU MLPs, and
a transformer-ish block on 8 tokens of width 32 (layernorm, softmax attention, relu feed-forward); each
at batch 1 and 64, l-inf ball of radius --eps around random inputs.
For each method (IBP, IBP with float64 products, CROWN, optionally alpha-CROWN) and case: median wall time of ours
(outward rounded: "IBP" is the default, float32 BLAS products with rigorous error bounds where they cost at most
2**-9 of a width; "IBP f64" and CROWN run every product in float64; the model read once, as
auto_LiRPA's BoundedModule does) and of auto_LiRPA's ``compute_bounds`` in
float32 (its usual precision) and float64, the time ratio ours/theirs(float32), and the largest
ratio of our output width to each of theirs (ours is sound: it may be wider than the float64 peer
only by outward rounding; a ratio below 1 is a tighter bound). Under each "IBP" line: per layer whose
float32 spread would hold subnormals (ReLU-pinned units), their count and the spread product's time on
them against the flushed operands ours hands BLAS (the host's subnormal penalty). Under each "IBP f64"
line: the time of the float64 matrix products its linear layers cannot do without (a floor under any
float64 rule), against the peer's whole float32 IBP, and ours against the peer's float64 IBP.

auto_LiRPA is optional: fetch its GitHub source and ``pip install --no-deps -e`` it (plus appdirs,
graphviz), or it is picked up from /work/peers/auto_LiRPA if that checkout exists. Its defaults are
kept (CROWN with sparse intermediate bounds, patches for convolutions, adaptive ReLU lower slopes).
Without it the peer columns are skipped.

Run: ``python bench/bounds_bench.py [--repeat N] [--eps R] [--threads T] [--only mlp,cnn,res]
[--batches 1,64] [--methods ibp,ibp64,crown,alpha-crown]``. alpha-CROWN (ours: optimized slopes for the
output bounds of linear/relu chains; auto_LiRPA's: its defaults, 20 Adam steps, which also optimize
the intermediate bounds) is not run by default. Both
sides get the same number of BLAS/OpenMP threads (default 1: on a shared host a multi-threaded BLAS
spins on busy cores and the timings measure the neighbours, not the code).
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--eps", type=float, default=0.01)
    parser.add_argument("--threads", type=int, default=1,
                        help="BLAS/OpenMP threads for both sides (0: each library's own default)")
    parser.add_argument("--only", default="mlp,cnn,res,tanh,sigmoid,gelu,silu,attn",
                        help="comma-separated cases: mlp, cnn, res, tanh, sigmoid, gelu, silu, attn")
    parser.add_argument("--batches", default="1,64", help="comma-separated batch sizes")
    parser.add_argument("--methods", default="ibp,ibp64,crown",
                        help="comma-separated methods: ibp, ibp64 (float64 products), crown, alpha-crown")
    return parser.parse_args()


ARGS = _parse_args() if __name__ == "__main__" else None
if ARGS is not None and ARGS.threads:  # thread counts must be fixed before numpy and torch load their BLAS
    for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[_var] = str(ARGS.threads)

import numpy as np  # noqa: E402

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

import torchlean_bridge as tlb  # noqa: E402
from semantics.interval import IntervalPropagator  # noqa: E402
from semantics.linear_bounds import Crown  # noqa: E402
from torchlean_bridge.bundle import Bundle  # noqa: E402

PEER_CHECKOUT = Path("/work/peers/auto_LiRPA")


def load_peer() -> Any | None:
    """auto_LiRPA if installed (or from its checkout), else None with a message saying how to get it."""
    for attempt in range(2):
        try:
            import auto_LiRPA
            return auto_LiRPA
        except ImportError as e:
            reason = e
        if attempt == 0 and PEER_CHECKOUT.exists():
            sys.path.insert(0, str(PEER_CHECKOUT))
    print(f"auto_LiRPA is not importable ({reason}); install it with `pip install --no-deps {PEER_CHECKOUT}` "
          f"(plus appdirs, graphviz) to compare. Showing our figures only.")
    return None


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10))


def cnn() -> nn.Module:
    return nn.Sequential(nn.Conv2d(1, 8, 4, stride=2, padding=1), nn.ReLU(), nn.Conv2d(8, 16, 4, stride=2, padding=1),
                         nn.ReLU(), nn.Flatten(), nn.Linear(16 * 7 * 7, 100), nn.ReLU(), nn.Linear(100, 10))


def tanh_mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(100, 256), nn.ReLU(), nn.Linear(256, 256), nn.Tanh(), nn.Linear(256, 10))


def sigmoid_cnn() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 8, 4, stride=2, padding=1), nn.ReLU(), nn.Conv2d(8, 16, 4, stride=2, padding=1),
                         nn.Sigmoid(), nn.Flatten(), nn.Linear(16 * 8 * 8, 10))


def gelu_mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(100, 256), nn.GELU(), nn.Linear(256, 256), nn.GELU(), nn.Linear(256, 10))


def silu_mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(100, 256), nn.SiLU(), nn.Linear(256, 256), nn.SiLU(), nn.Linear(256, 10))


class AttentionBlock(nn.Module):
    """A transformer-ish block on 8 tokens of width 32: layernorm, one softmax attention head with a
    residual, layernorm, a ReLU feed-forward with a residual, then a linear head on the flattened tokens.
    Our CROWN bounds its softmax, layernorms and the two products of computed tensors (Q K^T, att V)
    through their decompositions (``semantics/linear_bounds/expand.py``, McCormick planes); the
    auto_LiRPA peer's default softmax relaxation is its direct LSE bound."""

    def __init__(self, tokens: int = 8, width: int = 32) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.q, self.k, self.v = (nn.Linear(width, width) for _ in range(3))
        self.ff1, self.ff2 = nn.Linear(width, 2 * width), nn.Linear(2 * width, width)
        self.head = nn.Linear(tokens * width, 10)
        self.scale = width ** -0.5

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        att = torch.softmax(torch.matmul(self.q(h), self.k(h).transpose(1, 2)) * self.scale, dim=-1)
        x = x + torch.matmul(att, self.v(h))
        x = x + self.ff2(torch.relu(self.ff1(self.norm2(x))))
        return self.head(torch.flatten(x, 1))


class Residual(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(1, 8, 4, stride=2, padding=1)
        self.conv1 = nn.Conv2d(8, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.head = nn.Linear(8 * 14 * 14, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.stem(x))
        h = torch.relu(self.conv2(torch.relu(self.conv1(h))) + h)
        return self.head(torch.flatten(h, 1))


def build_ir(model: nn.Sequential, x: torch.Tensor) -> Bundle:
    """Our IR of the model: the fx importer when it exists, else the shared builder from the weights."""
    try:
        return tlb.import_fx(model, (x,))
    except (ImportError, AttributeError):
        pass
    from importers.builder import GraphBuilder
    b = GraphBuilder("builder")
    nid = b.input(tuple(x.shape))
    shape = tuple(x.shape)
    for name, m in model.named_children():
        if isinstance(m, nn.Linear):
            shape = shape[:-1] + (m.out_features,)
            nid = b.add("linear", [nid], shape=shape)
            b.param(nid, "weight", m.weight.detach().double().numpy(), key=f"{name}.weight")
            b.param(nid, "bias", m.bias.detach().double().numpy(), key=f"{name}.bias")
        elif isinstance(m, nn.Conv2d):
            attrs = dict(spatial_rank=2, kernel=list(m.kernel_size), stride=list(m.stride), padding=list(m.padding),
                         padding_after=list(m.padding), dilation=list(m.dilation), groups=m.groups,
                         channel_axis=1, in_channels=m.in_channels, out_channels=m.out_channels)
            nid = b.add("conv", [nid], attrs)
            b.param(nid, "weight", m.weight.detach().double().numpy(), key=f"{name}.weight")
            b.param(nid, "bias", m.bias.detach().double().numpy(), key=f"{name}.bias")
            shape = b.shape(nid)
        elif isinstance(m, nn.ReLU):
            nid = b.add("relu", [nid])
        elif isinstance(m, nn.Flatten):
            nid = b.reshape(nid, (shape[0], int(np.prod(shape[1:]))))
            shape = b.shape(nid)
        else:
            raise TypeError(f"bench builder: no lowering for {type(m).__name__}")
    return b.finish([nid])


def median_times(fns: list[Callable[[], Any]], repeat: int) -> list[float]:
    """Median wall time of each function; runs are interleaved so both sides see the same machine load
    (the benchmark host is shared)."""
    for fn in fns:
        fn()  # warm-up (first-call allocation, auto_LiRPA's lazy setup)
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeat):
        for fn, ts in zip(fns, times):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
    return [float("nan") if fn is _failed else statistics.median(ts) for fn, ts in zip(fns, times)]


def _peer_bounds(model: nn.Module, x: torch.Tensor, eps: float, method: str
                 ) -> Callable[[], tuple[torch.Tensor, torch.Tensor]]:
    from auto_LiRPA import BoundedModule, BoundedTensor
    from auto_LiRPA.perturbations import PerturbationLpNorm
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bounded = BoundedModule(model, torch.empty_like(x), device="cpu", verbose=False)
    bx = BoundedTensor(x, PerturbationLpNorm(norm=np.inf, eps=eps))

    def compute() -> tuple[torch.Tensor, torch.Tensor]:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return bounded.compute_bounds(x=(bx,), method=method)
    return compute


def run_case(name: str, model: nn.Module, x: torch.Tensor, eps: float, repeat: int, peer: Any | None,
             methods: list[str]) -> None:
    model.eval()
    bundle = build_ir(model, x)
    c = x.double().numpy()
    lower, upper = c - eps, c + eps
    out = bundle.graph.outputs[0]
    # like auto_LiRPA's BoundedModule, both of ours read the model once (float64 weights, |W|)
    propagator = IntervalPropagator(bundle.graph, bundle.payload)  # the default: float32 products where they pay
    propagator64 = IntervalPropagator(bundle.graph, bundle.payload, products="float64")
    crown = Crown(bundle.graph, bundle.payload)
    ours = {"IBP": lambda: propagator(lower, upper)[out],
            "IBP f64": lambda: propagator64(lower, upper)[out],
            "CROWN": lambda: (lambda r: (r.lower[0], r.upper[0]))(crown(lower, upper)),
            "alpha-CROWN": lambda: (lambda r: (r.lower[0], r.upper[0]))(crown(lower, upper, method="alpha-crown"))}
    for method, fn in ours.items():
        if method.lower().replace(" f64", "64") not in methods:
            continue
        fns = [fn]
        case_peer = peer
        if peer is not None:
            peer_method = method.split()[0]  # ours with float64 products against the same peer IBP
            peer32 = _working(lambda: _peer_bounds(model, x, eps, peer_method), "float32")
            if peer32 is _failed:
                case_peer = None
            else:
                fns += [peer32, _working(lambda: _peer_bounds(copy.deepcopy(model).double(), x.double(), eps,
                                                              peer_method), "float64")]
        floor = _linear_product_floor(bundle, x.shape[0]) if method == "IBP f64" and case_peer is not None else None
        times = median_times(fns + ([floor] if floor else []), repeat)
        lo, hi = fn()
        width = hi - lo
        line = f"{name:<28} {method:<11} ours {times[0] * 1e3:9.2f} ms"
        if case_peer is None:
            print(f"{line}   output width mean {width.mean():.9g}")
            continue
        w32 = [(b - a).double().numpy() for a, b in [fns[1]()]][0]
        w64 = [(b - a).numpy() for a, b in [fns[2]()]][0] if fns[2] is not _failed else np.full(width.shape, np.nan)
        print(f"{line}   auto_LiRPA f32 {times[1] * 1e3:9.2f} ms  f64 {times[2] * 1e3:9.2f} ms   "
              f"time ratio ours/f32 {times[0] / times[1]:5.2f}   width ratio max: /f64 {_ratio(width, w64):.12f}  "
              f"/f32 {_ratio(width, w32):.8f}")
        if floor:
            print(f"{'':<28} {'':<11} float64 products of its linear layers alone {times[3] * 1e3:.2f} ms = "
                  f"{times[3] / times[1]:.2f} x auto_LiRPA f32's whole IBP (ours/f64 {times[0] / times[2]:.2f})")
        if method == "IBP":
            for line in _subnormal_lines(bundle, propagator64(lower, upper), repeat):
                print(f"{'':<28} {'':<11} {line}")


def _subnormal_lines(bundle: Bundle, boxes: list, repeat: int) -> list[str]:
    """Per linear layer after the first whose float32 spread (``_doubled_spread``, rounded to float32)
    holds subnormals: how many, and the spread product |W| v32 on those operands against the same product
    on the flushed operands that the float32 rule hands BLAS. The ratio is this host's subnormal
    penalty: about 40x on x86 cores that take microcode assists, near 1 on cores that do not."""
    from semantics.rules.affine import AffineParams
    from semantics.rules.affine32 import _doubled, _doubled_spread, float32_weights, flush_subnormals
    lines = []
    for node in bundle.graph.nodes:
        if node.kind != "linear" or node.parents[0] in bundle.graph.inputs:
            continue
        weight = np.asarray(bundle.payload.get(node.id, "weight"), np.float64)
        w32 = float32_weights(AffineParams.of(weight, np.zeros(weight.shape[0])), weight.shape[1])
        spread = _doubled_spread(*_doubled(*boxes[node.parents[0]]), w32) if w32 is not None else None
        if spread is None:
            continue
        raw = spread[0].astype(np.float32)
        subnormal = int(np.count_nonzero((raw > 0) & (raw < np.float32(2.0 ** -126))))
        if not subnormal:
            continue
        flushed = flush_subnormals(raw.copy())
        abs_t = np.ascontiguousarray(w32.abs_weight.T)
        t_raw, t_flushed = median_times([lambda: raw @ abs_t, lambda: flushed @ abs_t], repeat)
        lines.append(f"node {node.id}: spread {subnormal} of {raw.size} float32 subnormals; |W| v32 product "
                     f"unflushed {t_raw * 1e3:.2f} ms, flushed (ours) {t_flushed * 1e3:.2f} ms "
                     f"(host subnormal penalty {t_raw / t_flushed:.2f}x)")
    return lines


def _failed() -> None:
    """Stands for a peer configuration that raises (auto_LiRPA's float64 tanh/sigmoid relaxations mix
    float32 tables into float64 tensors): its columns print nan."""
    return None


def _working(make: Callable[[], Callable[[], Any]], precision: str) -> Callable[[], Any]:
    """The peer's bound function from ``make``, or ``_failed`` when building or running it raises (auto_LiRPA
    has no Erf, so no GELU, and its float64 tanh/sigmoid relaxations mix float32 tables into float64)."""
    try:
        fn = make()
        fn()
    except (RuntimeError, NotImplementedError) as e:
        print(f"  (auto_LiRPA {precision} skipped: {str(e).splitlines()[0][:100]})")
        return _failed
    return fn


def _linear_product_floor(bundle: Bundle, batch: int) -> Callable[[], None] | None:
    """The float64 matrix products interval linear layers cannot do without, as one function (None
    without linear layers): the center product of each, and the radius product of each but the
    first (an l-inf ball's uniform radius needs row sums only). No rule can be faster than these."""
    rng = np.random.default_rng(0)
    weights = [np.asarray(bundle.payload.get(n.id, "weight"), np.float64).T
               for n in bundle.graph.nodes if n.kind == "linear"]
    operands = [(rng.random((batch, w.shape[0])), w, np.abs(w) if i else None) for i, w in enumerate(weights)]
    if not operands:
        return None

    def products() -> None:
        for a, w, abs_w in operands:
            a @ w
            if abs_w is not None:
                a @ abs_w
    return products


def _ratio(ours: np.ndarray, theirs: np.ndarray) -> float:
    """Largest ours/theirs over the outputs (1 where both are 0)."""
    if np.isnan(theirs).all():
        return float("nan")
    with np.errstate(all="ignore"):
        r = np.where(theirs > 0, ours / np.where(theirs > 0, theirs, 1.0), np.where(ours > 0, np.inf, 1.0))
    return float(np.max(r))


def _gemm_line() -> str:
    """The machine's float64 / float32 matrix-product speed, the floor under IBP's time on large layers
    (ours in float64, auto_LiRPA's in float32)."""
    rng = np.random.default_rng(0)
    a, w = rng.random((64, 1024)), rng.random((1024, 1024))
    a32, w32 = a.astype(np.float32), w.astype(np.float32)
    t64, t32 = median_times([lambda: a @ w, lambda: a32 @ w32], 10)
    return f"BLAS 64x1024 @ 1024x1024: float64 {t64 * 1e3:.2f} ms, float32 {t32 * 1e3:.2f} ms (ratio {t64 / t32:.2f})"


def main(args: argparse.Namespace) -> None:
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    peer = load_peer()
    threads = args.threads or "default"
    print(f"l-inf radius {args.eps}, median of {args.repeat} interleaved runs, {threads} thread(s) each")
    print(_gemm_line())
    models = {"mlp": ("MLP 784-1024-1024-10", mlp(), (784,)), "cnn": ("CNN 1x28x28", cnn(), (1, 28, 28)),
              "res": ("residual CNN 1x28x28", Residual(), (1, 28, 28)),
              "tanh": ("MLP relu-tanh 100-256-256-10", tanh_mlp(), (100,)),
              "sigmoid": ("CNN relu-sigmoid 3x32x32", sigmoid_cnn(), (3, 32, 32)),
              "gelu": ("MLP gelu 100-256-256-10", gelu_mlp(), (100,)),
              "silu": ("MLP silu 100-256-256-10", silu_mlp(), (100,)),
              "attn": ("attention block 8x32", AttentionBlock(), (8, 32))}
    for key in args.only.split(","):
        name, net, shape = models[key]
        for batch in (int(b) for b in args.batches.split(",")):
            run_case(f"{name} b{batch}", net, torch.rand((batch,) + shape), args.eps, args.repeat, peer,
                     args.methods.split(","))


if __name__ == "__main__":
    main(ARGS)
