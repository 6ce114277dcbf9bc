"""A small AST mutation tester: does the suite notice when the code is changed?

For each mutation point of the named modules (a comparison flipped, an operator swapped, a constant
or message changed, a returned value dropped, ``continue`` turned into ``break``, a call statement
removed, a keyword argument set to None, min/max or down/up exchanged, a condition negated) the
module is rewritten in a scratch copy of the repository and the chosen tests run against it. A
mutant is *killed* when a test fails (or times out) and *survives* when they all pass; the score is
killed / (killed + survived). Survivors are printed with their location and the mutated text, to be
either killed by a new test or listed as equivalent in docs/mutation-testing.md.

Heavy third-party modules are imported once and every mutant runs in a forked child (``pytest.main``),
so a mutant costs its tests' run time, not an interpreter start-up. Runs are sequential (one core).

    python tools/mutate.py --preset check                   # validation: torchlean_bridge/check.py
    python tools/mutate.py --preset interval --sample 60    # interval rules, 60 mutants drawn (seeded)
    python tools/mutate.py --preset audit --lines 100-180   # only the mutation points on those lines
    python tools/mutate.py semantics/resize.py --tests tests/test_interval_ops.py -k resize --list
    python tools/mutate.py --preset interval --survivors-of run.json --tests tests/test_interval_*.py
"""

from __future__ import annotations

import argparse
import ast
import copy
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PRESETS = {
    "check": (["torchlean_bridge/check.py"], ["tests/test_check_errors.py", "tests/test_core_seed.py"]),
    "interval": (["semantics/interval.py", "semantics/interval_arith.py", "semantics/interval_round.py",
                  "semantics/rules/activations.py", "semantics/rules/softmax.py", "semantics/rules/normalization.py",
                  "semantics/rules/affine.py", "semantics/rules/reductions.py", "semantics/rules/elementwise.py"],
                 ["tests/test_interval_tightness.py", "tests/test_interval_edges.py", "tests/test_interval.py"]),
    "audit": (["torchlean_bridge/app/audit.py"], ["tests/test_audit.py"]),
}
# the float rules beside the interval rules in semantics/rules/ are the float evaluator's, tested against
# torch by tests/test_semantics*.py: the interval preset leaves them out
PRESET_SKIPS = {"interval": ({"float_rule"}, {"sigmoid", "softplus", "log_softmax", "softmax"})}

COMPARE_SWAPS = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq,
                 ast.NotEq: ast.Eq, ast.In: ast.NotIn, ast.NotIn: ast.In, ast.Is: ast.IsNot, ast.IsNot: ast.Is}
BINOP_SWAPS = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult, ast.FloorDiv: ast.Div,
               ast.Mod: ast.Mult, ast.Pow: ast.Mult, ast.BitAnd: ast.BitOr, ast.BitOr: ast.BitAnd}
NAME_SWAPS = {"min": "max", "max": "min", "minimum": "maximum", "maximum": "minimum", "down": "up", "up": "down",
              "floor": "ceil", "ceil": "floor", "any": "all", "all": "any", "nanmin": "nanmax", "nanmax": "nanmin",
              "isneginf": "isposinf", "isposinf": "isneginf", "argmin": "argmax", "argmax": "argmin"}
SKIP_FIELDS = {"annotation", "returns", "type_comment"}


@dataclass
class Point:
    index: int  # position in the deterministic walk
    op: str
    line: int
    path: str = ""


def _walk(tree: ast.AST):
    """Nodes in a fixed order, skipping annotations, docstrings and ``__all__``."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        children = []
        for field, value in ast.iter_fields(node):
            if field in SKIP_FIELDS:
                continue
            items = value if isinstance(value, list) else [value]
            for i, child in enumerate(items):
                if not isinstance(child, ast.AST):
                    continue
                if (field == "body" and i == 0 and isinstance(child, ast.Expr) and isinstance(child.value, ast.Constant)
                        and isinstance(child.value.value, str)):
                    continue  # docstring
                if isinstance(child, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__"
                                                         for t in child.targets):
                    continue
                children.append(child)
        stack.extend(reversed(children))


def _ops(node: ast.AST, parent_is_fstring: bool) -> list[str]:
    ops = []
    if isinstance(node, ast.Compare):
        ops += [f"compare{i}" for i, op in enumerate(node.ops) if type(op) in COMPARE_SWAPS]
    elif isinstance(node, ast.BinOp) and type(node.op) in BINOP_SWAPS:
        ops.append("binop")
    elif isinstance(node, ast.AugAssign) and type(node.op) in BINOP_SWAPS:
        ops.append("augop")
    elif isinstance(node, ast.BoolOp):
        ops.append("boolop")
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.Not, ast.USub)):
        ops.append("unary")
    elif isinstance(node, ast.Constant):
        v = node.value
        if isinstance(v, bool):
            ops.append("bool")
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            ops.append("number")
        elif isinstance(v, str) and v and not parent_is_fstring:
            ops.append("string")
    elif isinstance(node, ast.JoinedStr) and any(isinstance(p, ast.Constant) and p.value for p in node.values):
        ops.append("fstring")
    elif isinstance(node, ast.Return) and node.value is not None and not (
            isinstance(node.value, ast.Constant) and node.value.value is None):
        ops.append("return_none")
    elif isinstance(node, (ast.Continue, ast.Break)):
        ops.append("loopctl")
    elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
        ops.append("drop_call")
    elif isinstance(node, ast.keyword) and node.arg is not None and not (
            isinstance(node.value, ast.Constant) and node.value.value is None):
        ops.append("kwarg_none")
    elif isinstance(node, ast.Name) and node.id in NAME_SWAPS and isinstance(node.ctx, ast.Load):
        ops.append("name")
    elif isinstance(node, ast.Attribute) and node.attr in NAME_SWAPS:
        ops.append("attr")
    elif isinstance(node, (ast.If, ast.While, ast.IfExp)):
        ops.append("negate")
    return ops


def _skipped(fn: ast.AST, skip_decorators: set[str], skip_functions: set[str]) -> bool:
    if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return False
    names = {d.func.id if isinstance(d, ast.Call) and isinstance(d.func, ast.Name) else getattr(d, "id", None)
             for d in fn.decorator_list}
    return fn.name in skip_functions or bool(names & skip_decorators)


def points(tree: ast.AST, skip_decorators: set[str] = frozenset(),
           skip_functions: set[str] = frozenset()) -> list[Point]:
    """Every mutation point, except inside functions decorated with one of ``skip_decorators`` or named
    in ``skip_functions`` (e.g. the float rules living beside the interval rules of an op family)."""
    out = []
    fstring_parts = {id(p) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for p in n.values}
    skipped = {id(n) for fn in ast.walk(tree) if _skipped(fn, skip_decorators, skip_functions) for n in ast.walk(fn)}
    for i, node in enumerate(_walk(tree)):
        if id(node) in skipped:
            continue
        for op in _ops(node, id(node) in fstring_parts):
            out.append(Point(i, op, getattr(node, "lineno", 0)))
    return out


def _apply(node: ast.AST, op: str) -> ast.AST | None:
    """Mutate ``node`` in place (or return its replacement)."""
    if op.startswith("compare"):
        k = int(op[len("compare"):])
        node.ops[k] = COMPARE_SWAPS[type(node.ops[k])]()
    elif op in ("binop", "augop"):
        node.op = BINOP_SWAPS[type(node.op)]()
    elif op == "boolop":
        node.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
    elif op == "unary":
        return node.operand
    elif op == "bool":
        node.value = not node.value
    elif op == "number":
        node.value = node.value + 1
    elif op == "string":
        node.value = "XX" + node.value + "XX"
    elif op == "fstring":
        part = next(p for p in node.values if isinstance(p, ast.Constant) and p.value)
        part.value = "XX" + part.value + "XX"
    elif op == "return_none":
        node.value = ast.Constant(None)
    elif op == "loopctl":
        return ast.Break() if isinstance(node, ast.Continue) else ast.Continue()
    elif op == "drop_call":
        return ast.Pass()
    elif op == "kwarg_none":
        node.value = ast.Constant(None)
    elif op == "name":
        node.id = NAME_SWAPS[node.id]
    elif op == "attr":
        node.attr = NAME_SWAPS[node.attr]
    elif op == "negate":
        node.test = ast.UnaryOp(ast.Not(), node.test)
    return None


def mutant_source(tree: ast.AST, point: Point) -> tuple[str, str]:
    """The whole module with ``point`` applied, and the mutated statement's text for the report."""
    tree = copy.deepcopy(tree)
    parents = {}
    for parent in ast.walk(tree):
        for field, value in ast.iter_fields(parent):
            for child in (value if isinstance(value, list) else [value]):
                if isinstance(child, ast.AST):
                    parents[id(child)] = (parent, field)
    target = next(n for i, n in enumerate(_walk(tree)) if i == point.index)
    before = _text(target)
    replacement = _apply(target, point.op)
    if replacement is not None:
        parent, field = parents[id(target)]
        value = getattr(parent, field)
        if isinstance(value, list):
            value[value.index(target)] = replacement
        else:
            setattr(parent, field, replacement)
        target = replacement
    ast.fix_missing_locations(tree)
    return ast.unparse(tree), f"{before} -> {_text(target)}"


def _text(node: ast.AST) -> str:
    """A node's first source line, shortened (for the report)."""
    try:
        text = ast.unparse(node)
    except Exception:  # noqa: BLE001 - a report string only
        text = type(node).__name__
    first = text.splitlines()[0] if text else ""
    return first if len(first) <= 70 else first[:67] + "..."


def scratch_copy() -> Path:
    """The packages, tests and fixtures in a temporary folder (no bytecode caches)."""
    dest = Path(tempfile.mkdtemp(prefix="mutate-"))
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".git", "*.egg-info", ".hypothesis")
    for entry in ROOT.iterdir():
        if entry.name.startswith(".") or entry.name in ("bench", "docs"):
            continue
        if entry.is_dir():
            shutil.copytree(entry, dest / entry.name, ignore=ignore)
        else:
            shutil.copy2(entry, dest / entry.name)
    return dest


def run_tests(root: Path, tests: list[str], extra: list[str], timeout: float) -> str:
    """'passed', 'failed' or 'timeout': pytest.main in a forked child, with the scratch copy first on the path."""
    pid = os.fork()
    if pid == 0:  # child
        try:
            os.chdir(root)
            sys.path.insert(0, str(root))
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            os.dup2(devnull, 2)
            import pytest
            code = pytest.main(["-x", "-q", "-p", "no:cacheprovider", *extra, *tests])
            os._exit(0 if code == 0 else 1)
        except BaseException:  # noqa: BLE001 - any crash of a mutant is a kill
            os._exit(1)
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return "passed" if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0 else "failed"
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return "timeout"
        time.sleep(0.02)


def preload() -> None:
    """Third-party modules the tests import, loaded once in the parent (inherited by every fork)."""
    for name in ("numpy", "pytest", "hypothesis", "mpmath", "safetensors", "onnx", "onnxruntime", "torch"):
        try:
            __import__(name)
        except ImportError:
            pass


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("modules", nargs="*", help="module files relative to the repository root")
    p.add_argument("--preset", choices=sorted(PRESETS))
    p.add_argument("--tests", nargs="+", default=[], help="test files run against each mutant")
    p.add_argument("-k", dest="keyword", help="pytest -k expression")
    p.add_argument("--sample", type=int, help="run only this many mutants, drawn with --seed")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lines", help="only mutation points on lines A-B")
    p.add_argument("--list", action="store_true", help="list the mutation points and exit")
    p.add_argument("--skip-decorator", action="append", default=[], help="leave out functions with this decorator")
    p.add_argument("--skip-function", action="append", default=[], help="leave out the function of this name")
    p.add_argument("--json", metavar="FILE", help="write every result as JSON")
    p.add_argument("--survivors-of", metavar="FILE.json",
                   help="re-test only the survivors of an earlier --json run (e.g. with more --tests)")
    args = p.parse_args(argv)
    modules, tests = list(args.modules), list(args.tests)
    if args.preset:
        modules, tests = modules or PRESETS[args.preset][0], tests or PRESETS[args.preset][1]
    if not modules or not tests:
        p.error("give modules and --tests, or --preset")
    extra = ["-k", args.keyword] if args.keyword else []
    trees = {m: ast.parse((ROOT / m).read_text(), m) for m in modules}
    skip_decorators, skip_functions = set(args.skip_decorator), set(args.skip_function)
    if args.preset in PRESET_SKIPS:
        skip_decorators |= PRESET_SKIPS[args.preset][0]
        skip_functions |= PRESET_SKIPS[args.preset][1]
    todo = [Point(pt.index, pt.op, pt.line, m) for m, t in trees.items()
            for pt in points(t, skip_decorators, skip_functions)]
    if args.lines:
        a, b = map(int, args.lines.split("-"))
        todo = [pt for pt in todo if a <= pt.line <= b]
    if args.survivors_of:
        earlier = json.loads(Path(args.survivors_of).read_text())["results"]
        wanted = {(r["module"], r["line"], r["op"], r["mutant"]) for r in earlier if r["status"] == "SURVIVED"}
        todo = [pt for pt in todo if (pt.path, pt.line, pt.op, mutant_source(trees[pt.path], pt)[1]) in wanted]
    if args.sample is not None and args.sample < len(todo):
        todo = sorted(random.Random(args.seed).sample(todo, args.sample), key=lambda q: (q.path, q.index))
    if args.list:
        for pt in todo:
            print(f"{pt.path}:{pt.line} {pt.op}: {mutant_source(trees[pt.path], pt)[1]}")
        print(f"{len(todo)} mutation points")
        return 0
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.dont_write_bytecode = True
    os.environ["PYTHONDONTWRITEBYTECODE"] = "1"
    preload()
    root = scratch_copy()
    results = []
    try:
        start = time.monotonic()
        if run_tests(root, tests, extra, timeout=1800) != "passed":
            print("the tests fail on the unmutated code: fix that first", file=sys.stderr)
            return 2
        baseline = time.monotonic() - start
        timeout = 3 * baseline + 10
        print(f"baseline {baseline:.1f}s, {len(todo)} mutants, timeout {timeout:.0f}s each", flush=True)
        for n, pt in enumerate(todo, 1):
            source, text = mutant_source(trees[pt.path], pt)
            try:
                compile(source, pt.path, "exec")
            except SyntaxError:
                continue
            original = (ROOT / pt.path).read_text()
            (root / pt.path).write_text(source)
            try:
                outcome = run_tests(root, tests, extra, timeout)
            finally:
                (root / pt.path).write_text(original)
            status = {"passed": "SURVIVED", "failed": "killed", "timeout": "killed (timeout)"}[outcome]
            results.append({"module": pt.path, "line": pt.line, "op": pt.op, "mutant": text, "status": status})
            if outcome == "passed" or n % 25 == 0:
                print(f"[{n}/{len(todo)}] {status}: {pt.path}:{pt.line} {pt.op}: {text}", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    killed = sum(r["status"] != "SURVIVED" for r in results)
    survived = [r for r in results if r["status"] == "SURVIVED"]
    score = killed / len(results) if results else 1.0
    print(f"\nscore: {killed}/{len(results)} killed ({100 * score:.1f}%), {len(survived)} survived")
    for r in survived:
        print(f"  survived {r['module']}:{r['line']} {r['op']}: {r['mutant']}")
    if args.json:
        Path(args.json).write_text(json.dumps({"score": score, "results": results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
