"""Read VNN-COMP VNNLIB properties: input boxes and unsafe output conditions.

A VNNLIB file (an SMT-LIB subset) declares inputs ``X_i`` and outputs ``Y_j`` and asserts the
*unsafe* condition: the property is ``sat`` (violated) iff some input satisfying the assertions
maps to outputs satisfying them. `read_vnnlib` turns the conjunction of all assertions into
disjunctive normal form and groups it by input box:

    prop = read_vnnlib("prop_6.vnnlib")
    for region in prop.regions:                 # a disjunction of input boxes
      region.lower, region.upper                # float64 arrays of shape (n_inputs,)
      box = region.interval(model.input_shape)  # a bj.Interval, rounded outward to float32
      for disjunct in region.disjuncts:         # a disjunction of unsafe output conditions
        disjunct.C, disjunct.d                  # unsafe iff C @ y <= d (every row), y = f(x)

The property is ``sat`` iff for some region, some ``x`` in its box and some disjunct,
``C @ f(x) - d <= 0`` holds row by row. To prove a disjunct unreachable on a box it suffices that
one row ``i`` is violated everywhere: ``min_x (C_i f(x) - d_i) > 0``; `crown_spec` gives the
matrix for ``bj.crown(fn, spec=...)`` and `unsafe_rows_lower` turns its lower bound into lower
bounds of ``C f(x) - d``.

Supported syntax: ``(declare-const X_i Real)`` / ``(declare-const Y_j Real)``;
``(assert F)`` where F is built from ``and``, ``or``, ``not`` and the comparisons ``<= >= < > =``
of linear expressions (numbers, variables, ``+``, ``-``, and ``*`` with at most one
non-constant factor, ``/`` by a constant). Input constraints must be bounds of one input by
constants; output constraints may be any linear inequality in Y; one atom may not mix X and Y.
Strict comparisons (``<``, ``>``) are read as non-strict (the closure of the unsafe set, which
every verifier of the competition uses; a sound ``unsat`` on the closure is ``unsat``). Numbers
are parsed as the Python float (float64) of their literal. Anything else raises
`VnnlibError` with the line number.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
import re
from typing import Any, Sequence

import jax.numpy as jnp
import numpy as np

from boundjax.core.interval import Interval

__all__ = ["VnnlibError", "VnnlibProperty", "Region", "Disjunct", "read_vnnlib", "parse_vnnlib",
           "crown_spec", "unsafe_rows_lower", "outward"]


class VnnlibError(ValueError):
  """A VNNLIB text that cannot be read (syntax, an unsupported construct, missing bounds)."""


@dataclasses.dataclass(frozen=True, eq=False)
class Disjunct:
  """A conjunction of linear output constraints: unsafe iff ``C @ y <= d`` (every row).

  ``C`` has shape (k, n_outputs) and ``d`` shape (k,), float64. ``k = 0`` means no output
  condition (every output is unsafe once the input is in the box)."""
  C: np.ndarray
  d: np.ndarray

  def __iter__(self):
    """Unpacks as ``C, d = disjunct``."""
    yield self.C
    yield self.d

  def holds(self, y: Any, tol: float = 0.0) -> bool:
    """Whether the output vector ``y`` (flattened) satisfies every row: ``C @ y - d <= tol``."""
    y = np.asarray(y, dtype=np.float64).reshape(-1)
    return bool(np.all(self.C @ y - self.d <= tol))

  def violated_by(self, y: Any, tol: float = 0.0) -> np.ndarray:
    """True where every row holds, ``C y - d <= tol``, for outputs ``y`` of shape
    (..., n_outputs): `holds` for a batch."""
    return np.all(np.asarray(y) @ self.C.T - self.d <= tol, axis=-1)


def outward(lower: Any, upper: Any, dtype: Any = np.float32) -> tuple[np.ndarray, np.ndarray]:
  """``lower``, ``upper`` rounded to ``dtype`` outward: the smallest box of ``dtype`` numbers
  that contains the (float64) box."""
  lower, upper = np.asarray(lower, np.float64), np.asarray(upper, np.float64)
  lo, hi = lower.astype(dtype), upper.astype(dtype)
  lo = np.where(lo.astype(np.float64) > lower, np.nextafter(lo, dtype(-np.inf)), lo)
  hi = np.where(hi.astype(np.float64) < upper, np.nextafter(hi, dtype(np.inf)), hi)
  return lo.astype(dtype), hi.astype(dtype)


@dataclasses.dataclass(frozen=True, eq=False)
class Region:
  """An input box ``lower <= x <= upper`` (float64, shape (n_inputs,)) and the disjunction of
  unsafe output conditions asserted with it."""
  lower: np.ndarray
  upper: np.ndarray
  disjuncts: tuple[Disjunct, ...]

  @property
  def dim(self) -> int:
    """The number of inputs the box bounds."""
    return int(np.size(self.lower))

  def interval(self, shape: Sequence[int] | None = None, dtype: Any = np.float32) -> Interval:
    """The box as a `boundjax.Interval` of ``shape`` (e.g. ``model.input_shape``; ``X_i`` fill it
    in row-major order), rounded outward to ``dtype`` so that it contains the exact box (a bound
    proved on it holds on the property's box). Its corners may lie outside the exact box by one
    float32 ulp: check a counterexample against ``lower``/``upper``."""
    lo, hi = outward(self.lower, self.upper, np.dtype(dtype).type)
    shape = lo.shape if shape is None else tuple(shape)
    return Interval(jnp.asarray(lo.reshape(shape)), jnp.asarray(hi.reshape(shape)))


@dataclasses.dataclass(frozen=True, eq=False)
class VnnlibProperty:
  """A VNNLIB property: ``sat`` iff some region has an input in its box whose output satisfies
  one of the region's disjuncts."""
  n_inputs: int
  n_outputs: int
  regions: tuple[Region, ...]
  path: str = "<string>"

  def is_counterexample(self, x: Any, y: Any, tol: float = 0.0) -> bool:
    """Whether ``(x, y)`` lies in some region's box and satisfies one of its disjuncts (up to
    ``tol`` on the output rows; the box is checked exactly)."""
    x = np.asarray(x, dtype=np.float64).reshape(-1)
    return any(np.all(r.lower <= x) and np.all(x <= r.upper) and
               any(dj.holds(y, tol) for dj in r.disjuncts) for r in self.regions)


def crown_spec(disjunct: Disjunct) -> np.ndarray:
  """The specification matrix for ``bj.crown(fn, spec=...)`` of one disjunct: ``C`` (float32).

  CROWN bounds ``spec @ y``; its lower bound ``L`` gives ``min (C y - d) >= L - d``
  (`unsafe_rows_lower`). The disjunct (every row ``C_i y <= d_i``) is unreachable on the box
  when some row has ``L_i - d_i > 0``: that row is violated everywhere. Raises ``ValueError``
  if ``C`` is not exactly representable in float32 (the bound would be of another matrix).
  """
  spec = np.asarray(disjunct.C, dtype=np.float32)
  if not np.array_equal(spec.astype(np.float64), np.asarray(disjunct.C, np.float64)):
    raise ValueError("crown_spec: the property's coefficients are not exact in float32; bound "
                     "C @ y in float64 (e.g. the complete verifier, boundjax.verify) instead.")
  return spec


def unsafe_rows_lower(disjunct: Disjunct, spec_lower: Any) -> np.ndarray:
  """Lower bounds of ``C y - d`` from the lower bound of ``crown_spec(disjunct) @ y``.

  The unsafe condition needs every row ``<= 0``, so the disjunct is unreachable on the box if any
  entry (along the last axis) is ``> 0``. (Rounding: ``d`` is float64 and the subtraction is
  done in float64; with ``bj.crown(..., sound=True)`` the result is a sound lower bound up to
  that one float64 subtraction, which is rounded downward here.)
  """
  lower = np.asarray(spec_lower, dtype=np.float64) - np.asarray(disjunct.d, np.float64)
  return np.nextafter(lower, -np.inf)


# ----------------------------------------------------------------------------------------------
# Tokens and s-expressions
# ----------------------------------------------------------------------------------------------

_TOKEN = re.compile(r";[^\n]*|\(|\)|[^\s();]+")


@dataclasses.dataclass(frozen=True)
class _Atom:
  text: str
  line: int


@dataclasses.dataclass
class _List:
  items: list
  line: int


def _parse_sexprs(text: str) -> list[_List | _Atom]:
  """The top-level s-expressions of ``text``, each with the line it starts on; comments (``;``
  to the end of the line) are dropped."""
  stack: list[_List] = [_List([], 1)]
  line, pos = 1, 0
  for m in _TOKEN.finditer(text):
    line += text.count("\n", pos, m.start())
    pos = m.start()
    token = m.group()
    if token[0] == ";":
      continue
    if token == "(":
      stack.append(_List([], line))
    elif token == ")":
      if len(stack) == 1:
        raise VnnlibError(f"line {line}: unbalanced ')'")
      done = stack.pop()
      stack[-1].items.append(done)
    else:
      stack[-1].items.append(_Atom(token, line))
  if len(stack) > 1:
    raise VnnlibError(f"line {stack[-1].line}: '(' is never closed")
  return stack[0].items


# ----------------------------------------------------------------------------------------------
# Linear expressions and formulas
# ----------------------------------------------------------------------------------------------

_VAR = re.compile(r"^([XY])_(\d+)$")


_NUMBER = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")


def _number(text: str) -> float | None:
  """The float64 of a decimal literal (Python's correctly rounded ``float``), else None."""
  return float(text) if _NUMBER.match(text) else None


@dataclasses.dataclass(frozen=True)
class _Linear:
  """``sum coef[v] * v + const`` with variables ``('X', i)`` / ``('Y', j)``."""
  coef: tuple
  const: float

  @staticmethod
  def of(coef: dict, const: float) -> "_Linear":
    return _Linear(tuple(sorted((k, v) for k, v in coef.items() if v != 0)), const)

  def scaled(self, c: float) -> "_Linear":
    return _Linear.of({k: c * v for k, v in self.coef}, c * self.const)

  def plus(self, other: "_Linear", sign: float = 1.0) -> "_Linear":
    coef = dict(self.coef)
    for k, v in other.coef:
      coef[k] = coef.get(k, 0.0) + sign * v
    return _Linear.of(coef, self.const + sign * other.const)


@dataclasses.dataclass(frozen=True)
class _Le:
  """The atom ``expr <= 0``."""
  expr: _Linear
  line: int


def _expr(e: _List | _Atom, declared: dict) -> _Linear:
  if isinstance(e, _Atom):
    value = _number(e.text)
    if value is not None:
      return _Linear((), value)
    if e.text not in declared:
      raise VnnlibError(f"line {e.line}: {e.text!r} is neither a number nor a declared variable")
    return _Linear(((declared[e.text], 1.0),), 0.0)
  if not e.items or not isinstance(e.items[0], _Atom):
    raise VnnlibError(f"line {e.line}: expected an arithmetic expression")
  op, args = e.items[0].text, [_expr(a, declared) for a in e.items[1:]]
  if op == "+" and args:
    out = args[0]
    for a in args[1:]:
      out = out.plus(a)
    return out
  if op == "-" and len(args) == 1:
    return args[0].scaled(-1.0)
  if op == "-" and args:
    out = args[0]
    for a in args[1:]:
      out = out.plus(a, -1.0)
    return out
  if op == "*" and args:
    out = _Linear((), 1.0)
    for a in args:
      if not out.coef:
        out = a.scaled(out.const)
      elif not a.coef:
        out = out.scaled(a.const)
      else:
        raise VnnlibError(f"line {e.line}: a product of two variables is not linear")
    return out
  if op == "/" and len(args) == 2 and not args[1].coef and args[1].const != 0:
    return args[0].scaled(1.0 / args[1].const)
  raise VnnlibError(f"line {e.line}: unsupported arithmetic {op!r} with {len(args)} operands")


MAX_TERMS = 100_000
"""The largest disjunctive normal form `read_vnnlib` builds (a conjunction of n disjunctions of
two has 2^n terms)."""


def _conjoin(parts: Sequence[list[list[_Le]]], where: str) -> list[list[_Le]]:
  """The DNF of a conjunction of DNFs: the atoms common to all terms once, then the product of
  the real disjunctions (linear in the number of atoms when there are no disjunctions)."""
  common = [atom for p in parts if len(p) == 1 for atom in p[0]]
  branches = [p for p in parts if len(p) != 1]
  size = math.prod(len(b) for b in branches)
  if size > MAX_TERMS:
    raise VnnlibError(f"{where}: the disjunctive normal form has {size} terms (more than "
                      f"{MAX_TERMS}): too many disjunctions in one conjunction")
  return [common + [atom for term in combo for atom in term]
          for combo in itertools.product(*branches)]


def _dnf(f: _List | _Atom, declared: dict, negate: bool = False) -> list[list[_Le]]:
  """A formula as a disjunction (list) of conjunctions (lists) of atoms ``expr <= 0``."""
  if not isinstance(f, _List) or not f.items or not isinstance(f.items[0], _Atom):
    raise VnnlibError(f"line {f.line}: expected a formula such as (<= X_0 1.0) or (and ...)")
  op, args = f.items[0].text, f.items[1:]
  if op == "not":
    if len(args) != 1:
      raise VnnlibError(f"line {f.line}: 'not' takes one formula")
    return _dnf(args[0], declared, not negate)
  if op in ("and", "or"):
    is_and = (op == "and") != negate
    parts = [_dnf(a, declared, negate) for a in args]
    if not is_and:
      return [conj for p in parts for conj in p]
    return _conjoin(parts, f"line {f.line}")
  if op in ("<=", ">=", "<", ">", "="):
    if len(args) < 2:
      raise VnnlibError(f"line {f.line}: {op!r} needs two operands")
    exprs = [_expr(a, declared) for a in args]
    atoms_by_pair = []
    for a, b in zip(exprs, exprs[1:]):
      if op == "=":
        if negate:
          raise VnnlibError(f"line {f.line}: a negated equality (!=) is not supported")
        atoms_by_pair += [_Le(a.plus(b, -1.0), f.line), _Le(b.plus(a, -1.0), f.line)]
        continue
      le = op in ("<=", "<")
      if negate:
        le = not le
      atoms_by_pair.append(_Le(a.plus(b, -1.0) if le else b.plus(a, -1.0), f.line))
    if negate and len(atoms_by_pair) > 1:  # not (a <= b <= c) = (a > b) or (b > c)
      return [[atom] for atom in atoms_by_pair]
    return [atoms_by_pair]
  raise VnnlibError(f"line {f.line}: unsupported operator {op!r}")


# ----------------------------------------------------------------------------------------------
# The property
# ----------------------------------------------------------------------------------------------

def _split_term(term: list[_Le], n_in: int, n_out: int):
  """One DNF term as (input lower, input upper, C, d)."""
  lower = np.full(n_in, -np.inf)
  upper = np.full(n_in, np.inf)
  rows, rhs = [], []
  for atom in term:
    kinds = {k[0] for k, _ in atom.expr.coef}
    if kinds == {"X"}:
      if len(atom.expr.coef) != 1:
        raise VnnlibError(f"line {atom.line}: an input constraint must bound one input by a "
                          "constant (linear constraints over several inputs are not supported)")
      ((_, i), c), = atom.expr.coef
      bound = -atom.expr.const / c + 0.0  # c x + k <= 0 (+ 0.0: no -0.0 bounds)
      if c > 0:
        upper[i] = min(upper[i], bound)
      else:
        lower[i] = max(lower[i], bound)
    elif kinds == {"Y"}:
      row = np.zeros(n_out)
      for (_, j), c in atom.expr.coef:
        row[j] = c
      rows.append(row)
      rhs.append(0.0 - atom.expr.const)
    elif not kinds:
      if atom.expr.const > 0:  # a false constant atom: the term is empty
        return None
    else:
      raise VnnlibError(f"line {atom.line}: a constraint mixing inputs and outputs is not "
                        "supported")
  C = np.array(rows, dtype=np.float64).reshape(len(rows), n_out)
  return lower, upper, C, np.array(rhs, dtype=np.float64)


def parse_vnnlib(text: str, n_inputs: int | None = None, n_outputs: int | None = None,
                 path: str = "<string>") -> VnnlibProperty:
  """`read_vnnlib` of a string."""
  declared: dict[str, tuple[str, int]] = {}
  asserted: list[list[list[_Le]]] = []
  decl_line: dict[tuple[str, int], int] = {}
  for e in _parse_sexprs(text):
    if isinstance(e, _Atom):
      raise VnnlibError(f"line {e.line}: unexpected {e.text!r} outside a command")
    head = e.items[0].text if e.items and isinstance(e.items[0], _Atom) else None
    if head == "declare-const":
      if len(e.items) != 3 or not all(isinstance(a, _Atom) for a in e.items[1:]):
        raise VnnlibError(f"line {e.line}: expected (declare-const NAME Real)")
      name, sort = e.items[1].text, e.items[2].text
      m = _VAR.match(name)
      if m is None:
        raise VnnlibError(f"line {e.line}: variable {name!r} is not named X_i or Y_j")
      if sort != "Real":
        raise VnnlibError(f"line {e.line}: sort {sort!r} is not supported (only Real)")
      declared[name] = (m.group(1), int(m.group(2)))
      decl_line[declared[name]] = e.line
    elif head == "assert":
      if len(e.items) != 2:
        raise VnnlibError(f"line {e.line}: assert takes one formula")
      asserted.append(_dnf(e.items[1], declared))
    elif head in ("set-logic", "set-info", "set-option", "check-sat", "get-model", "exit"):
      continue
    else:
      raise VnnlibError(f"line {e.line}: unsupported command {head!r}")

  def count(kind: str, given: int | None) -> int:
    indices = sorted(i for k, i in declared.values() if k == kind)
    n = len(indices)
    if indices != list(range(n)):
      raise VnnlibError(f"{path}: the {kind} variables declared are not {kind}_0 .. {kind}_{n - 1}")
    if given is not None and given != n:
      raise VnnlibError(f"{path}: {n} {kind} variables declared, expected {given}")
    return n

  n_in, n_out = count("X", n_inputs), count("Y", n_outputs)
  if n_in == 0:
    raise VnnlibError(f"{path}: no input variables X_i declared")

  regions: dict[tuple, tuple[np.ndarray, np.ndarray, list[Disjunct]]] = {}
  for term in _conjoin(asserted, "the assertions"):
    split = _split_term(term, n_in, n_out)
    if split is None:
      continue
    lower, upper, C, d = split
    if np.any(lower > upper):
      continue  # an empty box: this term can never hold
    missing = np.flatnonzero(~np.isfinite(lower) | ~np.isfinite(upper))
    if missing.size:
      i = int(missing[0])
      raise VnnlibError(f"line {decl_line[('X', i)]}: input X_{i} (declared there) has no finite "
                        "lower and upper bound in some input region")
    key = (lower.tobytes(), upper.tobytes())
    if key not in regions:
      regions[key] = (lower, upper, [])
    regions[key][2].append(Disjunct(C, d))
  return VnnlibProperty(n_in, n_out, tuple(Region(lo, hi, tuple(ds))
                                           for lo, hi, ds in regions.values()), path)


def read_vnnlib(path: str | os.PathLike, n_inputs: int | None = None,
                n_outputs: int | None = None) -> VnnlibProperty:
  """Reads a VNN-COMP VNNLIB file (see the module docstring).

  Args:
    path: the ``.vnnlib`` file.
    n_inputs, n_outputs: the expected numbers of ``X_i`` / ``Y_j`` (checked if given).

  Returns:
    A `VnnlibProperty`: its ``regions`` (input boxes, float64), each with the disjuncts of its
    unsafe output condition (``C @ y <= d``).

  Raises:
    VnnlibError: unsupported syntax or semantics, with the line number.
  """
  path = os.fspath(path)
  with open(path) as f:
    text = f.read()
  try:
    return parse_vnnlib(text, n_inputs, n_outputs, path)
  except VnnlibError as e:
    msg = str(e)
    raise VnnlibError(msg if msg.startswith(path) else f"{path}: {msg}") from None
