"""IBP speed and tightness: our ``interval_bounds`` against auto_LiRPA's IBP (a benchmark peer only).

Models: a 784-1024-1024-10 MLP (batch 1 and 64) and a small CNN (3x32x32: conv 16 k3, relu,
conv 32 k3 stride 2, relu, flatten, linear 10). For each: median wall time of our propagation
(float64, outward rounded, every node's box kept) and of auto_LiRPA's
``compute_bounds(method="IBP")`` (float32, round-to-nearest), their ratio, and the output bound
widths side by side.

auto_LiRPA is optional: install it for this script only (``pip install --no-deps
/work/peers/auto_LiRPA`` plus appdirs, graphviz, ...), or it is picked up from
/work/peers/auto_LiRPA if that checkout exists. Without it the peer column is skipped.

Run: ``python bench/bounds_bench.py [--repeat N] [--eps R] [--threads T]``. Both sides get the same
number of BLAS/OpenMP threads (default 1: on a shared host a multi-threaded BLAS spins on busy
cores and the timings measure the neighbours, not the code).
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
    parser.add_argument("--threads", type=int, default=1, help="BLAS/OpenMP threads for both sides")
    return parser.parse_args()


ARGS = _parse_args() if __name__ == "__main__" else None
if ARGS is not None:  # thread counts must be fixed before numpy and torch load their BLAS
    for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[_var] = str(ARGS.threads)

import numpy as np  # noqa: E402

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

import torchlean_bridge as tlb  # noqa: E402
from semantics.interval import IntervalPropagator  # noqa: E402
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
    return nn.Sequential(nn.Conv2d(3, 16, 3), nn.ReLU(), nn.Conv2d(16, 32, 3, stride=2), nn.ReLU(), nn.Flatten(),
                         nn.Linear(32 * 14 * 14, 10))


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
    return [statistics.median(ts) for ts in times]


def _peer_bounds(model: nn.Module, x: torch.Tensor, eps: float) -> Callable[[], tuple[torch.Tensor, torch.Tensor]]:
    from auto_LiRPA import BoundedModule, BoundedTensor
    from auto_LiRPA.perturbations import PerturbationLpNorm
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bounded = BoundedModule(model, torch.empty_like(x), device="cpu", verbose=False)
    bx = BoundedTensor(x, PerturbationLpNorm(norm=np.inf, eps=eps))

    def compute() -> tuple[torch.Tensor, torch.Tensor]:
        with torch.no_grad():
            return bounded.compute_bounds(x=(bx,), method="IBP")
    return compute


def run_case(name: str, model: nn.Module, x: torch.Tensor, eps: float, repeat: int, peer: Any | None) -> None:
    model.eval()
    bundle = build_ir(model, x)
    c = x.double().numpy()
    lower, upper = c - eps, c + eps

    # like auto_LiRPA's BoundedModule, the propagator reads the model once (float64 weights, |W|)
    propagator = IntervalPropagator(bundle.graph, bundle.payload)

    def ours() -> list:
        return propagator(lower, upper)

    def ours_one_shot() -> list:
        return tlb.interval_bounds(bundle.graph, bundle.payload, lower, upper)

    out = bundle.graph.outputs[0]
    lo, hi = ours()[out]
    our_width = hi - lo
    if peer is None:
        t_ours, t_once = median_times([ours, ours_one_shot], repeat)
        print(f"{name:<24} ours {t_ours * 1e3:8.2f} ms (one-shot interval_bounds {t_once * 1e3:.2f} ms)   "
              f"output width mean {our_width.mean():.9g}")
        return
    theirs = _peer_bounds(model, x, eps)
    # the same model in float64 through auto_LiRPA: the exact IBP widths up to binary64 rounding,
    # and the cost of IBP in our arithmetic without our outward rounding
    theirs64 = _peer_bounds(copy.deepcopy(model).double(), x.double(), eps)
    t_ours, t_once, t_theirs, t_theirs64 = median_times([ours, ours_one_shot, theirs, theirs64], repeat)
    lb, ub = theirs()
    width32 = (ub - lb).double().numpy()
    lb64, ub64 = theirs64()
    width64 = (ub64 - lb64).numpy()
    print(f"{name:<24} ours {t_ours * 1e3:8.2f} ms   auto_LiRPA {t_theirs * 1e3:8.2f} ms   "
          f"ratio ours/theirs {t_ours / t_theirs:5.2f}   (one-shot interval_bounds {t_once * 1e3:.2f} ms; "
          f"auto_LiRPA in float64 {t_theirs64 * 1e3:.2f} ms)")
    print(f"{'':<24} output width mean: ours {our_width.mean():.12g}   auto_LiRPA float32 {width32.mean():.12g}   "
          f"auto_LiRPA float64 {width64.mean():.12g}")
    print(f"{'':<24} max relative excess of our width: over float32 {_excess(our_width, width32):.2g}, "
          f"over float64 {_excess(our_width, width64):.2g} (our outward rounding)")


def _excess(ours: np.ndarray, theirs: np.ndarray) -> float:
    return float(np.max((ours - theirs) / np.maximum(np.abs(theirs), 1e-300)))


def main(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    peer = load_peer()
    print(f"IBP, l-inf radius {args.eps}, median of {args.repeat} interleaved runs, {args.threads} thread(s) each")
    net = mlp()
    for batch in (1, 64):
        run_case(f"MLP 784-1024-1024-10 b{batch}", net, torch.rand(batch, 784), args.eps, args.repeat, peer)
    run_case("CNN 3x32x32 b1", cnn(), torch.rand(1, 3, 32, 32), args.eps, args.repeat, peer)


if __name__ == "__main__":
    main(ARGS)
