"""Scale: big checkpoints and long graphs (a benchmark, not a test; issue "Scale").

Generates an N-GiB ONNX model (square Gemm layers, float32 weights in external data) and the same
weights as safetensors, then measures each phase in a fresh subprocess so that its peak resident
memory is its own:

- ``onnx.load`` (with external data) and onnxruntime's session creation, the peers;
- ours: ``import_onnx`` alone, then import + evaluate + save as one process (the issue's target:
  peak RSS at most 1.3x the model bytes; anonymous memory reported apart from file-backed pages),
  evaluation time against onnxruntime's run, bundle save and load times;
- a 10^6-node chain: load_graph (of its wire file), check, evaluate (twice: the first also computes
  the graph's evaluation schedule), dump, save and load, against ``json.loads`` of the same file; each
  row the best and the median of ``--repeat`` fresh processes, wall-clock and CPU time (on a shared
  machine the CPU time is the one that does not count the other processes' turns; compare with the
  load average printed beside it).

    python bench/scale_bench.py [--gib 1.0] [--nodes 1000000] [--repeat 1] [--dir DIR] [--keep]
                                [--skip-chain] [--skip-gib]

Peak RSS comes from /proc/self/status (VmHWM); the anonymous peak from sampling /proc/self/status (RssAnon) every
few milliseconds in a thread, so it can miss a spike shorter than that. Targets (issue 17): import +
evaluate + save peak RSS <= 1.3x model bytes, import <= 1.5x onnxruntime's session creation, 10^6-node
load, check and evaluate <= 3 s each.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Each phase runs as `python -c PRELUDE + BODY`; the body sets `result` (a dict) and may use `timed`.
PRELUDE = textwrap.dedent("""
    import json, os, resource, sys, threading, time
    sys.path.insert(0, %(root)r)
    import numpy as np
    anon_peak = [0]
    def _sample():
        while True:
            with open('/proc/self/status') as f:
                for line in f:
                    if line.startswith('RssAnon:'):
                        anon_peak[0] = max(anon_peak[0], int(line.split()[1]) * 1024)
            time.sleep(0.002)
    if %(sample)r:
        threading.Thread(target=_sample, daemon=True).start()
    def timed(fn, *a, **k):
        t = time.perf_counter(); out = fn(*a, **k); return out, time.perf_counter() - t
    result = {}
""")
# VmHWM, not getrusage's ru_maxrss: Linux carries ru_maxrss over fork + exec, so a child would report the
# parent's (generator's) peak instead of its own.
EPILOGUE = textwrap.dedent("""
    with open('/proc/self/status') as f:
        result['peak_rss'] = next(int(l.split()[1]) * 1024 for l in f if l.startswith('VmHWM:'))
    result['peak_anon'] = anon_peak[0]
    print('RESULT ' + json.dumps(result))
""")


def run_phase(body: str, sample: bool = True, **params: object) -> dict:
    """``body`` in a fresh interpreter; ``sample``: watch the anonymous memory from a thread (which
    takes the interpreter lock every few milliseconds, so timing-only phases go without it)."""
    code = PRELUDE % {"root": str(ROOT), "sample": sample} + "\n".join(f"{k} = {v!r}" for k, v in params.items()) + "\n"
    code += textwrap.dedent(body) + EPILOGUE
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    return {"error": (proc.stderr.strip().splitlines() or ["no output"])[-1][:300]}


def make_model(folder: Path, gib: float, layers: int = 4) -> tuple[Path, Path, int, int]:
    """``layers`` square Gemm layers with float32 weights totalling about ``gib`` GiB, written one
    tensor at a time (the generator itself stays within one layer's memory)."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    from safetensors.numpy import save_file

    width = max(8, int(math.sqrt(gib * 2**30 / layers / 4)))
    rng = np.random.default_rng(0)
    nodes, inits, tensors = [], [], {}
    for i in range(layers):
        w = (rng.standard_normal((width, width), dtype=np.float32) / np.float32(math.sqrt(width)))
        b = rng.standard_normal(width, dtype=np.float32)
        inits += [numpy_helper.from_array(w, f"l{i}.weight"), numpy_helper.from_array(b, f"l{i}.bias")]
        tensors[f"l{i}.weight"], tensors[f"l{i}.bias"] = w, b
        src = "x" if i == 0 else f"h{i}"
        out = "y" if i == layers - 1 else f"g{i}"
        nodes.append(helper.make_node("Gemm", [src, f"l{i}.weight", f"l{i}.bias"], [out], transB=1))
        if i < layers - 1:
            nodes.append(helper.make_node("Relu", [out], [f"h{i + 1}"]))
    graph = helper.make_graph(nodes, "scale", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, width])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, width])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = folder / "model.onnx"
    onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="model.data", size_threshold=1024)
    st = folder / "model.safetensors"
    save_file(tensors, str(st))
    nbytes = sum(t.nbytes for t in tensors.values())
    return path, st, nbytes, width


PEER_ONNX_LOAD = """
import onnx
_, t = timed(onnx.load, path)
result['time'] = t
"""
PEER_ORT = """
import onnxruntime as ort
opts = ort.SessionOptions(); opts.intra_op_num_threads = 1
sess, t = timed(ort.InferenceSession, path, opts, providers=['CPUExecutionProvider'])
result['session'] = t
x = np.random.default_rng(1).standard_normal((1, width), dtype=np.float32)
sess.run(None, {'x': x})
times = [timed(sess.run, None, {'x': x})[1] for _ in range(5)]
result['run'] = sorted(times)[2]
"""
BASELINE = """
import onnx, onnxruntime, torchlean_bridge as tlb, importers.onnx, exporters.folder, semantics.evaluate
"""
OURS_IMPORT = """
import torchlean_bridge as tlb
b, t = timed(tlb.import_onnx, path)
result['import'] = t
"""
OURS_FULL = """
import torchlean_bridge as tlb
b, t = timed(tlb.import_onnx, path)
result['import'] = t
x = np.random.default_rng(1).standard_normal((1, width), dtype=np.float32)
tlb.evaluate(b.graph, b.payload, [x], dtype='float32')
times = [timed(tlb.evaluate, b.graph, b.payload, [x], dtype='float32')[1] for _ in range(3)]
result['evaluate_f32'] = sorted(times)[1]
_, result['save'] = timed(tlb.save, b, out)
_, result['load'] = timed(tlb.load, out)
"""
CHAIN = """
import gc
import torchlean_bridge as tlb
import semantics.evaluate  # imported up front: the evaluate row is the evaluation, not the first import
from torchlean_bridge.wire import dumps_document
doc = {'format': 'torchlean.ir.v1', 'input_id': 0, 'output_ids': [n - 1],
       'nodes': [{'id': 0, 'kind': 'input', 'parents': [], 'shape': [4]}]
                + [{'id': i, 'kind': 'relu' if i % 2 else 'tanh', 'parents': [i - 1], 'shape': [4]}
                   for i in range(1, n)]}
with open(wire, 'w') as f:
    f.write(dumps_document(doc))
del doc
gc.collect()
def phase(name, fn, *args):
    cpu = time.process_time()
    out, result[name] = timed(fn, *args)
    result[name + '_cpu'] = time.process_time() - cpu
    return out
def json_loads_file(path):
    with open(path, 'rb') as f:
        return json.loads(f.read())
phase('json_loads', json_loads_file, wire)
g = phase('load_graph', tlb.load_graph, wire)
phase('check', tlb.check, g)
x = np.linspace(-1, 1, 4)
phase('evaluate', tlb.evaluate, g, tlb.Payload(), [x])
phase('evaluate_again', tlb.evaluate, g, tlb.Payload(), [x])
phase('dump', tlb.dump_graph, g)
phase('save', tlb.save, tlb.Bundle(g, tlb.Payload()), out)
phase('load', tlb.load, out)
"""


def fmt_bytes(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**29 else f"{n / 2**20:.1f} MiB"


def model_section(folder: Path, gib: float) -> None:
    """The big-model rows: import, evaluate, save and load against onnx.load and onnxruntime."""
    path, _st, nbytes, width = make_model(folder, gib)
    print(f"model: 4 Gemm layers of {width}x{width} float32, {fmt_bytes(nbytes)} in external data\n")
    common = {"path": str(path), "width": width, "out": str(folder / "bundle")}
    base = run_phase(BASELINE).get("peak_rss", 0)
    print(f"interpreter with the libraries imported: {fmt_bytes(base)} resident (counted below)\n")
    onnx_load = run_phase(PEER_ONNX_LOAD, **common)
    ort = run_phase(PEER_ORT, **common)
    ours_import = run_phase(OURS_IMPORT, **common)
    ours = run_phase(OURS_FULL, **common)
    rows = [("onnx.load", onnx_load.get("time"), onnx_load),
            ("onnxruntime session", ort.get("session"), ort),
            ("ours import_onnx", ours_import.get("import"), ours_import),
            ("ours import+evaluate+save", None, ours)]
    print(f"{'phase':28} {'time':>9} {'peak RSS':>10} {'/model':>7} {'anon peak':>10} {'/model':>7}")
    for name, t, r in rows:
        if "error" in r:
            print(f"{name:28} failed: {r['error']}")
            continue
        ts = f"{t:8.2f}s" if t is not None else " " * 9
        print(f"{name:28} {ts} {fmt_bytes(r['peak_rss']):>10} {r['peak_rss'] / nbytes:7.2f} "
              f"{fmt_bytes(r['peak_anon']):>10} {r['peak_anon'] / nbytes:7.2f}")
    if "error" not in ours and "error" not in ort:
        print(f"\nimport / onnxruntime session: {ours['import'] / ort['session']:.2f} (target <= 1.5)")
        print(f"import / onnx.load:           {ours['import'] / onnx_load['time']:.2f}"
              if "time" in onnx_load else "")
        print(f"evaluate f32 / onnxruntime:   {ours['evaluate_f32'] / ort['run']:.2f} "
              f"({ours['evaluate_f32'] * 1e3:.1f} ms vs {ort['run'] * 1e3:.1f} ms)")
        print(f"peak RSS / model bytes:       {ours['peak_rss'] / nbytes:.2f} (target <= 1.3; "
              f"{(ours['peak_rss'] - base) / nbytes:.2f} above the interpreter's own; "
              f"anonymous {ours['peak_anon'] / nbytes:.2f}, moonshot <= 0.3)")
        print(f"save {ours['save']:.2f} s, load {ours['load']:.2f} s")


CHAIN_PHASES = ("json_loads", "load_graph", "check", "evaluate", "evaluate_again", "dump", "save", "load")


def chain_section(folder: Path, nodes: int, repeat: int) -> None:
    """The long-chain rows, each the best and the median of ``repeat`` fresh processes, with the ratio
    to ``json.loads`` of the same wire file (the peer: reading the text at all)."""
    runs = [run_phase(CHAIN, sample=False, n=nodes, out=str(folder / "chain"), wire=str(folder / "chain.json"))
            for _ in range(repeat)]
    print(f"\n{nodes}-node chain, {repeat} run(s) (target <= 3 s for load_graph, check, evaluate):")
    good = [r for r in runs if "error" not in r]
    if not good:
        print(f"  failed: {runs[0]['error']}")
        return
    peer = sorted(r["json_loads"] for r in good)[len(good) // 2]
    print(f"  {'phase':15} {'best':>8} {'median':>8} {'/json.loads':>12} {'CPU best':>9} {'CPU median':>11}")
    for k in CHAIN_PHASES:
        times = sorted(r[k] for r in good)
        cpu = sorted(r[k + "_cpu"] for r in good)
        median = times[len(times) // 2]
        print(f"  {k:15} {times[0]:7.2f}s {median:7.2f}s {median / peer:12.2f} {cpu[0]:8.2f}s "
              f"{cpu[len(cpu) // 2]:10.2f}s")
    print(f"  peak RSS {fmt_bytes(max(r['peak_rss'] for r in good))}; load average {os.getloadavg()[0]:.2f}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=1.0, help="model size in GiB (default 1)")
    ap.add_argument("--nodes", type=int, default=1_000_000, help="length of the long chain (default 10^6)")
    ap.add_argument("--repeat", type=int, default=1, help="runs of the long chain (best and median; default 1)")
    ap.add_argument("--dir", type=Path, default=None, help="where to write the model (default: a temp dir)")
    ap.add_argument("--keep", action="store_true", help="keep the generated files")
    ap.add_argument("--skip-chain", action="store_true", help="skip the long-graph timings")
    ap.add_argument("--skip-gib", action="store_true", help="skip the big-model timings (long graph only)")
    args = ap.parse_args(argv)
    if not 0 < args.gib <= 64 or args.nodes < 2 or args.repeat < 1:
        ap.error("--gib must be in (0, 64], --nodes at least 2 and --repeat at least 1")

    folder = Path(tempfile.mkdtemp(prefix="scale-bench-", dir=args.dir))
    try:
        if not args.skip_gib:
            model_section(folder, args.gib)
        if not args.skip_chain:
            chain_section(folder, args.nodes, args.repeat)
    finally:
        if args.keep:
            print(f"\nfiles kept in {folder}")
        else:
            shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
