"""VNN-LIB properties, the subset VNN-COMP uses (numpy only).

A property declares real constants ``X_0 .. X_{n-1}`` (the flattened network input) and
``Y_0 .. Y_{m-1}`` (the flattened output) and asserts a formula; a counterexample is an input whose
output satisfies every assertion. Supported: ``(declare-const X_i Real)``, ``(assert F)`` where F is
built from ``and``, ``or`` and the comparisons ``<=``, ``>=``, ``<``, ``>`` between linear terms
(numbers, variables, ``+``, ``-``, ``*`` by a constant). Every atom mentions only inputs or only
outputs. After conversion to a disjunction of conjunctions, each disjunct bounds every input from
both sides by single-variable atoms (a box) and constrains the outputs by ``C y <= d`` rows.
Anything else (other commands, ``=``, ``not``, ``=>``, non-linear terms, unbounded inputs, atoms
mixing X and Y) is refused with a ``BridgeError`` naming the line.

Strict comparisons are kept as flags, on output rows and on input bounds (an open side of the box): a
counterexample must satisfy them strictly, and a proof of infeasibility is the same for ``<`` and ``<=``
(the proof has a margin, and covers the closed box). Numbers are SMT-LIB numerals and decimals, signed
and with an optional exponent (``-1.5e-03``); nesting is limited to 256 levels.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..errors import BridgeError

__all__ = ["load_vnnlib", "parse_vnnlib", "Property", "Case"]

_MAX_DISJUNCTS = 100_000
_TOKEN = re.compile(r"\(|\)|[^\s()]+")
_VAR = re.compile(r"^([XY])_(0|[1-9]\d*)$")
_NUMBER = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")  # SMT-LIB decimals, plus exponents
_MAX_DEPTH = 256  # nesting levels: VNN-COMP files use fewer than 10; the formula readers recurse


@dataclass
class Case:
    """One input box with the output constraints that make a counterexample inside it: the outputs
    must satisfy ``C y <= d`` (row i strictly when ``strict[i]``) for the rows of at least one group."""

    lower: np.ndarray
    upper: np.ndarray
    groups: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = field(default_factory=list)  # (C, d, strict)
    lower_open: np.ndarray | None = None  # inputs bounded by a strict ``>`` (the bound itself is excluded)
    upper_open: np.ndarray | None = None

    def __post_init__(self) -> None:
        if self.lower_open is None:
            self.lower_open = np.zeros(np.shape(self.lower), dtype=bool)
        if self.upper_open is None:
            self.upper_open = np.zeros(np.shape(self.upper), dtype=bool)


@dataclass
class Property:
    n_inputs: int
    n_outputs: int
    cases: list[Case]
    path: str = "<string>"

    def shaped(self, input_shape: Sequence[int]) -> "Property":
        """The boxes reshaped to the network's input shape (checked against the input count)."""
        size = int(np.prod(input_shape))
        if size != self.n_inputs:
            raise BridgeError(f"VNN-LIB {self.path}: declares {self.n_inputs} inputs X_i, the network input "
                              f"{list(input_shape)} has {size}")
        cases = [Case(c.lower.reshape(input_shape), c.upper.reshape(input_shape), c.groups,
                      c.lower_open.reshape(input_shape), c.upper_open.reshape(input_shape)) for c in self.cases]
        return Property(self.n_inputs, self.n_outputs, cases, self.path)


class _Error(BridgeError):
    pass


def _tokens(text: str, where: str) -> list[tuple[str, int]]:
    out = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.split(";", 1)[0]
        out.extend((m.group(0), number) for m in _TOKEN.finditer(line))
    return out


def _parse_sexprs(tokens: list[tuple[str, int]], where: str) -> list[Any]:
    """Nested lists of (token, line) leaves; iterative, so deep nesting cannot overflow the stack."""
    stack: list[list] = [[]]
    lines: list[int] = []
    for tok, line in tokens:
        if tok == "(":
            if len(stack) > _MAX_DEPTH:
                raise _Error(f"VNN-LIB {where}: line {line}: nested deeper than {_MAX_DEPTH} levels")
            stack.append([])
            lines.append(line)
        elif tok == ")":
            if len(stack) == 1:
                raise _Error(f"VNN-LIB {where}: line {line}: unbalanced ')'")
            done = stack.pop()
            stack[-1].append((done, lines.pop()))
        else:
            stack[-1].append((tok, line))
    if len(stack) != 1:
        raise _Error(f"VNN-LIB {where}: line {lines[-1]}: '(' is never closed")
    return stack[0]


def _number(tok: str) -> float | None:
    """A numeral or decimal (optionally signed, with an exponent), else None: Python's own ``float``
    would also take ``inf``, ``nan`` and ``1_0``. The value may be non-finite or a nonzero literal
    rounded to 0 (beyond binary64's range): ``_Parser.term`` refuses those by name."""
    if not _NUMBER.match(tok):
        return None
    return float(tok)


def _nonzero_literal(tok: str) -> bool:
    """Whether a numeral's digits (before any exponent) are not all zero."""
    return any(ch in "123456789" for ch in re.split(r"[eE]", tok)[0])


class _Linear:
    """A linear term: {variable: coefficient} + constant."""

    literal: str | None = None  # a constant read from one numeral: its text (its exact value)

    def __init__(self, coef: dict[str, float] | None = None, const: float = 0.0) -> None:
        self.coef = coef or {}
        self.const = const

    def scaled(self, k: float) -> "_Linear":
        return _Linear({v: c * k for v, c in self.coef.items()}, self.const * k)

    def plus(self, other: "_Linear") -> "_Linear":
        coef = dict(self.coef)
        for v, c in other.coef.items():
            coef[v] = coef.get(v, 0.0) + c
        return _Linear(coef, self.const + other.const)


class _Parser:
    def __init__(self, where: str) -> None:
        self.where = where
        self.declared: dict[str, int] = {}

    def fail(self, line: int, message: str) -> _Error:
        return _Error(f"VNN-LIB {self.where}: line {line}: {message}")

    def term(self, expr: Any) -> _Linear:
        """The linear term of ``expr``; every coefficient and constant is a finite binary64 number, and a
        product of nonzero numbers is never rounded to 0 (out-of-range values are refused by line)."""
        node, line = expr
        if isinstance(node, str):
            v = _number(node)
            if v is not None:
                if not math.isfinite(v):
                    raise self.fail(line, f"the number {node} is beyond binary64's range (about 1.8e308)")
                if v == 0 and _nonzero_literal(node):
                    raise self.fail(line, f"the number {node} is nonzero but rounds to 0 in binary64 "
                                          f"(below about 4.9e-324)")
                t = _Linear(const=v)
                t.literal = node
                return t
            if node not in self.declared:
                raise self.fail(line, f"{node!r} is neither a number nor a declared X_i / Y_j")
            return _Linear({node: 1.0})
        if not node or not isinstance(node[0][0], str):
            raise self.fail(line, "empty or malformed term")
        op, args = node[0][0], node[1:]
        if op == "+":
            total = _Linear()
            for a in args:
                total = self.finite(total.plus(self.term(a)), line)
            return total
        if op == "-":
            if len(args) == 1:
                return self.term(args[0]).scaled(-1.0)
            if not args:
                raise self.fail(line, "'-' without operands")
            total = self.term(args[0])
            for a in args[1:]:
                total = self.finite(total.plus(self.term(a).scaled(-1.0)), line)
            return total
        if op == "*":
            parts = [self.term(a) for a in args]
            variable = [p for p in parts if p.coef]
            if len(variable) > 1:
                raise self.fail(line, "a product of two variables is not linear (outside the VNN-LIB subset)")
            k = 1.0
            for p in parts:
                if not p.coef:
                    k = self.product(k, p.const, line)
            if not variable:
                return _Linear(const=k)
            v = variable[0]
            return _Linear({name: self.product(c, k, line) for name, c in v.coef.items()}, self.product(v.const, k, line))
        raise self.fail(line, f"term operator {op!r} is outside the supported subset (+, -, *)")

    def finite(self, t: _Linear, line: int) -> _Linear:
        if not (math.isfinite(t.const) and all(math.isfinite(c) for c in t.coef.values())):
            raise self.fail(line, "a sum is beyond binary64's range (about 1.8e308)")
        return t

    def product(self, a: float, b: float, line: int) -> float:
        p = a * b
        if not math.isfinite(p):
            raise self.fail(line, f"the product {a!r} * {b!r} is beyond binary64's range (about 1.8e308)")
        if p == 0 and a != 0 and b != 0:
            raise self.fail(line, f"the product {a!r} * {b!r} is nonzero but rounds to 0 in binary64")
        return p

    def formula(self, expr: Any) -> list[list[tuple[_Linear, bool, int]]]:
        """DNF: a list of conjunctions of atoms (term <= 0, strict?, line)."""
        node, line = expr
        if isinstance(node, str) or not node or not isinstance(node[0][0], str):
            raise self.fail(line, f"expected a formula, got {node!r}" if isinstance(node, str) else "malformed formula")
        op, args = node[0][0], node[1:]
        if op == "and":
            dnf: list[list] = [[]]
            for a in args:
                part = self.formula(a)
                if len(dnf) * len(part) > _MAX_DISJUNCTS:
                    raise self.fail(line, f"more than {_MAX_DISJUNCTS} disjuncts after distributing 'and' over 'or'")
                dnf = [x + y for x in dnf for y in part]
            return dnf
        if op == "or":
            out: list[list] = []
            for a in args:
                out.extend(self.formula(a))
            if len(out) > _MAX_DISJUNCTS:
                raise self.fail(line, f"more than {_MAX_DISJUNCTS} disjuncts")
            return out
        if op in ("<=", ">=", "<", ">"):
            if len(args) < 2:
                raise self.fail(line, f"{op!r} needs two operands")
            terms = [self.term(a) for a in args]
            conj = []
            for left, right in zip(terms, terms[1:]):  # chained comparisons: each adjacent pair
                diff = left.plus(right.scaled(-1.0)) if op in ("<=", "<") else right.plus(left.scaled(-1.0))
                self.finite(diff, line)
                # a variable against one numeral (every VNN-COMP input bound): the numeral's exact value
                # places the bound (see parse_vnnlib)
                lit = right.literal if not right.coef and _one_variable(left) else \
                    left.literal if not left.coef and _one_variable(right) else None
                conj.append((diff, op in ("<", ">"), line, lit))
            return [conj]
        raise self.fail(line, f"{op!r} is outside the supported VNN-LIB subset (and, or, <=, >=, <, >)")

    def run(self, forms: list[Any]) -> tuple[int, int, list[list]]:
        asserts = []
        for node, line in forms:
            if isinstance(node, str) or not node or not isinstance(node[0][0], str):
                raise self.fail(line, "expected a command such as (declare-const X_0 Real) or (assert ...)")
            cmd = node[0][0]
            if cmd == "declare-const":
                if len(node) != 3 or not all(isinstance(x[0], str) for x in node[1:]):
                    raise self.fail(line, "declare-const expects a name and a sort")
                name, sort = node[1][0], node[2][0]
                if sort != "Real":
                    raise self.fail(line, f"sort {sort!r} is outside the subset (Real)")
                if not _VAR.match(name):
                    raise self.fail(line, f"constant {name!r}: the subset names inputs X_i and outputs Y_j")
                if name in self.declared:
                    raise self.fail(line, f"{name} is declared twice")
                self.declared[name] = line
            elif cmd == "assert":
                if len(node) != 2:
                    raise self.fail(line, "assert expects one formula")
                asserts.append(node[1])
            else:
                raise self.fail(line, f"command {cmd!r} is outside the supported VNN-LIB subset "
                                      f"(declare-const, assert)")
        counts = {}
        for kind in "XY":
            idx = sorted(int(_VAR.match(n).group(2)) for n in self.declared if n[0] == kind)
            if idx != list(range(len(idx))):  # names are canonical (no leading zeros), so no index repeats
                missing = sorted(set(range(max(idx, default=-1) + 1)) - set(idx))
                raise _Error(f"VNN-LIB {self.where}: {kind}_i must be declared for i = 0..n-1; missing "
                             f"{', '.join(f'{kind}_{i}' for i in missing[:5])}")
            counts[kind] = len(idx)
        if counts["X"] == 0 or counts["Y"] == 0:
            raise _Error(f"VNN-LIB {self.where}: declares {counts['X']} inputs and {counts['Y']} outputs; "
                         f"both must be at least 1")
        dnf: list[list] = [[]]
        for a in asserts:
            part = self.formula(a)
            if len(dnf) * len(part) > _MAX_DISJUNCTS:
                raise _Error(f"VNN-LIB {self.where}: more than {_MAX_DISJUNCTS} disjuncts")
            dnf = [x + y for x in dnf for y in part]
        return counts["X"], counts["Y"], dnf


def parse_vnnlib(text: str, where: str = "<string>") -> Property:
    """A property from VNN-LIB text (see the module docstring for the subset)."""
    p = _Parser(where)
    text = text.removeprefix("\ufeff")  # a UTF-8 byte order mark some editors write
    n_in, n_out, dnf = p.run(_parse_sexprs(_tokens(text, where), where))
    cases: dict[bytes, Case] = {}
    for conj in dnf:
        lo, hi = np.full(n_in, -np.inf), np.full(n_in, np.inf)
        lo_open, hi_open = np.zeros(n_in, dtype=bool), np.zeros(n_in, dtype=bool)
        rows, rhs, strict = [], [], []
        empty = False
        for term, is_strict, line, literal in conj:
            kinds = {v[0] for v in term.coef if term.coef[v] != 0}
            if kinds == {"X", "Y"}:
                raise p.fail(line, "an atom mixes inputs X and outputs Y (outside the VNN-LIB subset)")
            if not kinds:  # a constant comparison: true or false
                if term.const > 0 or (is_strict and term.const >= 0):
                    empty = True
                continue
            if kinds == {"X"}:
                live = [(v, c) for v, c in term.coef.items() if c != 0]
                if len(live) != 1:
                    raise p.fail(line, "input constraints must bound one X_i at a time (a box)")
                (v, c), = live
                i, bound = int(v[2:]), -term.const / c
                if not math.isfinite(bound) or (bound == 0 and term.const != 0):
                    raise p.fail(line, f"the bound {-term.const!r} / {c!r} on {v} is outside binary64's range")
                if literal is not None and abs(c) == 1.0:
                    bound, inexact = _outward(bound, literal, upper=c > 0)
                    is_strict = is_strict or inexact
                if c > 0:  # c x + k <= 0  ->  x <= -k / c
                    _tighten(hi, hi_open, i, bound, is_strict, np.less)
                else:
                    _tighten(lo, lo_open, i, bound, is_strict, np.greater)
                continue
            row = np.zeros(n_out)
            for v, c in term.coef.items():
                if c != 0:  # an input term may stand in an output atom with coefficient 0
                    row[int(v[2:])] += c
            rows.append(row)
            rhs.append(-term.const)
            strict.append(is_strict)
        if empty or np.any(lo > hi) or np.any((lo == hi) & (lo_open | hi_open)):
            continue  # this disjunct is unsatisfiable by itself (an empty, possibly open, box)
        unbounded = np.flatnonzero(~np.isfinite(lo) | ~np.isfinite(hi))
        if unbounded.size:
            raise _Error(f"VNN-LIB {where}: input X_{unbounded[0]} is not bounded on both sides in some disjunct "
                         f"(the subset needs a box on every input)")
        key = lo.tobytes() + hi.tobytes() + lo_open.tobytes() + hi_open.tobytes()
        case = cases.setdefault(key, Case(lo, hi, lower_open=lo_open, upper_open=hi_open))
        case.groups.append((np.array(rows).reshape(len(rows), n_out), np.array(rhs, dtype=np.float64),
                            np.array(strict, dtype=bool)))
    return Property(n_in, n_out, list(cases.values()), where)


def _one_variable(t: _Linear) -> bool:
    """Whether t is one variable with coefficient 1 and no constant."""
    return len(t.coef) == 1 and next(iter(t.coef.values())) == 1.0 and t.const == 0


def _outward(value: float, literal: str, upper: bool) -> tuple[float, bool]:
    """An input bound read from ``literal`` (``value`` its binary64 rounding) as a bound the box may use:
    where the decimal is not a binary64 number, the nearest binary64 number on the outside (the box then
    holds every real point of the property's box) and ``True``: that side is open, so a counterexample,
    a binary32 point, lies strictly inside, hence inside the decimal bound. Before, ``X_0 <= 0.1000000014901
    16119384765624`` rounded up to binary32's 0.1 and that point, above the bound, was reported as sat."""
    exact, rounded = Decimal(literal), Decimal(value)  # both exact
    if rounded == exact:
        return value, False
    if upper and rounded < exact:
        value = math.nextafter(value, math.inf)
    elif not upper and rounded > exact:
        value = math.nextafter(value, -math.inf)
    return value, True


def _tighten(bound: np.ndarray, is_open: np.ndarray, i: int, value: float, strict: bool, tighter: Any) -> None:
    """Input i's bound moved to ``value`` if that is tighter (``tighter(value, bound[i])``); at an equal
    value a strict comparison makes the bound open."""
    if tighter(value, bound[i]):
        bound[i], is_open[i] = value, strict
    elif value == bound[i]:
        is_open[i] |= strict


def load_vnnlib(path: str | Path, input_shape: Sequence[int] | None = None,
                n_outputs: int | None = None) -> Property:
    """Read a VNN-LIB file (``.gz`` decompressed); with ``input_shape`` the boxes take the network's input shape, with
    ``n_outputs`` the output count is checked."""
    plain = path
    if str(path).endswith(".gz"):  # VNN-COMP ships prop.vnnlib.gz: read its decompressed copy
        from .campaign.files import local_file
        plain = local_file(str(path))
    try:
        text = Path(plain).read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise BridgeError(f"VNN-LIB {path}: cannot read: {e}") from None
    prop = parse_vnnlib(text, str(path))
    if n_outputs is not None and prop.n_outputs != n_outputs:
        raise BridgeError(f"VNN-LIB {path}: declares {prop.n_outputs} outputs Y_j, the network has {n_outputs}")
    return prop.shaped(input_shape) if input_shape is not None else prop
