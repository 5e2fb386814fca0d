"""The `Interval` type: an axis-aligned box ``lower <= x <= upper`` as a JAX pytree.

An `Interval` is the abstract value of the interval domain (IBP) and the way users describe
uncertainty: an input box, a box over parameters (a hyper-network), a box over gradients.

Construction from concrete arrays validates the box (equal shapes, no complex dtype, no bool
mixed with numbers, finite endpoints, ``lower <= upper``) and raises `BoundError` (a
`ValueError`) naming the first offending position and the user's source line. Inside traced
code (``jit``, ``grad``, ``vmap``) validation is skipped: the values are not known yet.

Unflattening (``jax.tree_util.tree_map`` and ``tree_unflatten`` called from user code) checks
concrete numeric children for equal shapes, NaN and ``lower <= upper`` (±inf is allowed there:
an overflowed bound is still sound); see `Interval.tree_unflatten`.

The module also holds the interval matrix-product kernels (midpoint–radius "Rump" form and the
exact four-corner form), shared by the interval domain and by Abstract Gradient Training.
"""

from __future__ import annotations

from typing import Any, NoReturn

import jax
import jax.numpy as jnp
import numpy as np

from boundjax.core.errors import BoundError
from boundjax.core.validation import (array_problem, at_user_frame, box_problem,
                                 called_from_user_tree_op, dtype_problem, is_concrete_array,
                                 value_problem)

Array = jax.Array


def _is_concrete(x: Any) -> bool:
  """True when ``x`` holds known values (not a tracer)."""
  return not isinstance(x, jax.core.Tracer)


def _raise(what: str, problem: str) -> NoReturn:
  """Raises `BoundError` ``"<what>: <problem> at file.py:LINE (function)."``."""
  raise BoundError(f"{what}: {problem}{at_user_frame()}.")


def _validate(lower: Any, upper: Any) -> None:
  """Raises `BoundError` if ``[lower, upper]`` is not a valid box (concrete values only).

  Object-dtype endpoints (placeholders) are accepted; dtypes may differ except for complex
  and for bool mixed with numbers.
  """
  if not (_is_concrete(lower) and _is_concrete(upper)):
    return
  lo, hi = np.asarray(lower), np.asarray(upper)
  if lo.shape != hi.shape:
    _raise("Interval", f"lower and upper must have equal shapes, got {lo.shape} and {hi.shape}")
  if lo.dtype == object or hi.dtype == object:
    return  # placeholder leaves (e.g. during pytree transforms)
  problem = dtype_problem(lo.dtype, hi.dtype, strict=False) or value_problem(lo, hi)
  if problem is not None:
    _raise("Interval", problem)


def _checkable(x: Any) -> bool:
  """A concrete int or float array (not bool: predicates map boxes to bool placeholders)."""
  return is_concrete_array(x) and (jnp.issubdtype(x.dtype, jnp.integer) or
                                   jnp.issubdtype(x.dtype, jnp.floating))


@jax.tree_util.register_pytree_node_class
class Interval:
  """A box ``{x : lower <= x <= upper}`` (element-wise), registered as a JAX pytree.

  Attributes:
    lower: array of lower bounds.
    upper: array of upper bounds, same shape and dtype as ``lower``.
  """

  __slots__ = ("lower", "upper")

  def __init__(self, lower: Any, upper: Any, *, validate: bool = True):
    if validate:
      if not isinstance(lower, (jax.Array, np.ndarray)) and _is_concrete(lower):
        lower = jnp.asarray(lower)
      if not isinstance(upper, (jax.Array, np.ndarray)) and _is_concrete(upper):
        upper = jnp.asarray(upper)
      _validate(lower, upper)
    self.lower = lower
    self.upper = upper

  # -- pytree protocol: children are (lower, upper).
  def tree_flatten(self):
    return (self.lower, self.upper), None

  @classmethod
  def tree_unflatten(cls, aux, children):
    """Rebuilds an Interval; checks it when a user tree operation built it from concrete arrays.

    Checked (equal shapes, no NaN, ``lower <= upper``; ±inf allowed) only when both children
    are concrete int/float arrays (numpy, or jax.Array that is not a tracer) and the call comes
    from ``jax.tree_util.tree_map`` / ``tree_unflatten`` / ``jax.tree.map`` in user code. Not
    checked: placeholders (``object()``, ``None``, bools of predicates, tracers,
    ``ShapeDtypeStruct``, ``ShapedArray``), and trees rebuilt by JAX's machinery or a library
    (outputs and cotangents of ``jit``/``grad``/``vmap``/``scan``, flax, optax): a gradient
    with respect to an Interval is a pair of cotangents, not a box.
    """
    del aux
    lower, upper = children
    if _checkable(lower) and _checkable(upper) and called_from_user_tree_op():
      problem = value_problem(lower, upper, finite=False)
      if problem is not None:
        _raise("Interval rebuilt by a tree operation", problem + (
            "; if this tree is not a box (e.g. gradients), map it with "
            "is_leaf=bj.is_interval or build Interval(..., validate=False)"))
    return cls(lower, upper, validate=False)

  # -- constructors
  @classmethod
  def point(cls, x: Any) -> "Interval":
    """The degenerate box ``[x, x]``."""
    x = jnp.asarray(x)
    return cls(x, x)

  @classmethod
  def around(cls, x: Any, eps: Any, domain: tuple[float, float] | None = None) -> "Interval":
    """The L-infinity ball ``[x - eps, x + eps]``, optionally intersected with ``domain``.

    Args:
      x: centre.
      eps: radius (scalar or broadcastable array), must be >= 0 and not NaN.
      domain: optional ``(low, high)`` with ``low <= high``, e.g. ``(0.0, 1.0)`` for
        normalised images; the box is ``[clip(x - eps, low, high), clip(x + eps, low, high)]``.

    Raises:
      BoundError: for a negative or NaN ``eps``, a NaN or inverted ``domain``, or a box that is
        not valid (e.g. NaN in ``x``).
    """
    x = jnp.asarray(x)
    eps = jnp.asarray(eps, dtype=x.dtype if jnp.issubdtype(x.dtype, jnp.floating) else None)
    _check_radius("Interval.around", "eps", eps)
    lo, hi = x - eps, x + eps
    if domain is not None:
      _check_domain(domain)
      lo = jnp.clip(lo, domain[0], domain[1])
      hi = jnp.clip(hi, domain[0], domain[1])
    return cls(lo, hi)

  @classmethod
  def from_center_radius(cls, center: Any, radius: Any) -> "Interval":
    """The box ``[center - radius, center + radius]``; ``radius`` must be >= 0 and not NaN."""
    center, radius = jnp.asarray(center), jnp.asarray(radius)
    _check_radius("Interval.from_center_radius", "radius", radius)
    return cls(center - radius, center + radius)

  @classmethod
  def hull(cls, *xs: Any) -> "Interval":
    """Smallest box containing every argument (arrays or Intervals)."""
    los = [x.lower if isinstance(x, Interval) else x for x in xs]
    his = [x.upper if isinstance(x, Interval) else x for x in xs]
    lo, hi = los[0], his[0]
    for a, b in zip(los[1:], his[1:]):
      lo, hi = jnp.minimum(lo, a), jnp.maximum(hi, b)
    return cls(lo, hi, validate=False)

  # -- views
  @property
  def center(self) -> Array:
    """``c = l/2 + u/2``, clamped to ``[l, u]``.

    Halving first keeps ``c`` finite for finite endpoints ((l + u)/2 overflows to ±inf near the
    dtype's max); in the normal range the value equals round((l + u)/2). The clamp only acts
    when halving a subnormal endpoint rounds, so ``l <= c <= u`` always.
    """
    c = self.lower * 0.5 + self.upper * 0.5
    return jnp.minimum(jnp.maximum(c, self.lower), self.upper)

  @property
  def radius(self) -> Array:
    """``r = u/2 - l/2`` (finite for finite endpoints, unlike (u - l)/2, which overflows)."""
    return self.upper * 0.5 - self.lower * 0.5

  @property
  def width(self) -> Array:
    """``u - l``. May be +inf when ``u - l`` exceeds the dtype's max (e.g. ``[-3e38, 3e38]`` in
    float32): still a sound upper bound on the width; use ``2 * radius`` in a wider dtype for
    the value."""
    return self.upper - self.lower

  @property
  def shape(self) -> tuple[int, ...]:
    return tuple(jnp.shape(self.lower))

  @property
  def dtype(self):
    return jnp.result_type(self.lower)

  @property
  def ndim(self) -> int:
    return len(self.shape)

  def contains(self, x: Any, tol: float = 0.0) -> Array:
    """Element-wise ``lower - tol <= x <= upper + tol``."""
    return (x >= self.lower - tol) & (x <= self.upper + tol)

  def __getitem__(self, idx) -> "Interval":
    return Interval(self.lower[idx], self.upper[idx], validate=False)

  def __repr__(self) -> str:
    return f"Interval(shape={self.shape}, dtype={self.dtype}, lower={self.lower!r}, upper={self.upper!r})"


def _check_radius(what: str, name: str, r: Any) -> None:
  """Raises `BoundError` for a concrete radius with a negative or NaN entry."""
  if not _is_concrete(r):
    return
  a = np.asarray(r)
  if jnp.issubdtype(a.dtype, jnp.inexact) and np.any(np.isnan(a)):
    _raise(what, f"{name} must not be NaN, got {r}")
  if np.any(a < 0):
    _raise(what, f"{name} must be >= 0, got {r}")


def _check_domain(domain: Any) -> None:
  """Raises `BoundError` unless ``domain = (low, high)`` with concrete ``low <= high``, no NaN."""
  if len(domain) != 2:
    _raise("Interval.around", f"domain must be (low, high), got {domain!r}")
  low, high = domain
  if not (_is_concrete(low) and _is_concrete(high)):
    return
  lo, hi = np.asarray(low, np.float64), np.asarray(high, np.float64)
  if np.any(np.isnan(lo)) or np.any(np.isnan(hi)):
    _raise("Interval.around", f"domain must not contain NaN, got {domain!r}")
  if np.any(lo > hi):
    _raise("Interval.around", f"domain (low, high) must have low <= high, got {domain!r}")


def is_interval(x: Any) -> bool:
  return isinstance(x, Interval)


def lower_of(x: Any) -> Any:
  """``x.lower`` for an Interval, ``x`` itself for an array."""
  return x.lower if isinstance(x, Interval) else x


def upper_of(x: Any) -> Any:
  return x.upper if isinstance(x, Interval) else x


def split_tree(tree: Any) -> tuple[Any, Any]:
  """``(lower_tree, upper_tree)`` of a tree whose leaves are `Interval`s or arrays.

  The one interval-tree splitter of the package: an `Interval` leaf gives its endpoints, an array
  leaf appears unchanged in both trees, and a whole tree that is one `Interval` (over parameter
  trees) gives its two endpoint trees.
  """
  if isinstance(tree, Interval):
    return tree.lower, tree.upper
  lo = jax.tree_util.tree_map(lower_of, tree, is_leaf=is_interval)
  hi = jax.tree_util.tree_map(upper_of, tree, is_leaf=is_interval)
  return lo, hi


def join_tree(lower: Any, upper: Any, validate: bool = False) -> Any:
  """The tree of `Interval(l, h)` leaves from two trees of the same structure (`split_tree`'s inverse)."""
  return jax.tree_util.tree_map(lambda l, h: Interval(l, h, validate=validate), lower, upper)


def center_of(x: Any) -> Any:
  return x.center if isinstance(x, Interval) else x


def tree_contains(box_tree: Any, value_tree: Any, tol: float = 0.0) -> bool:
  """True when every Interval leaf of ``box_tree`` contains the matching leaf of ``value_tree``.

  Array leaves of ``box_tree`` must equal their counterpart up to ``tol``.
  """
  boxes = jax.tree_util.tree_leaves(box_tree, is_leaf=is_interval)
  values = jax.tree_util.tree_leaves(value_tree)
  if len(boxes) != len(values):
    raise ValueError(f"tree_contains: {len(boxes)} box leaves but {len(values)} value leaves.")
  for b, v in zip(boxes, values):
    if isinstance(b, Interval):
      ok = bool(jnp.all(b.contains(v, tol)))
    else:
      ok = bool(jnp.all(jnp.abs(jnp.asarray(b) - jnp.asarray(v)) <= tol))
    if not ok:
      return False
  return True


# ----------------------------------------------------------------------------------------------
# Interval products (shared kernels)
# ----------------------------------------------------------------------------------------------

def mul_bounds(al: Array, au: Array, bl: Array, bu: Array) -> tuple[Array, Array]:
  """Exact bounds of the element-wise product of boxes: min/max of the four corner products."""
  c1, c2, c3, c4 = al * bl, al * bu, au * bl, au * bu
  lo = jnp.minimum(jnp.minimum(c1, c2), jnp.minimum(c3, c4))
  hi = jnp.maximum(jnp.maximum(c1, c2), jnp.maximum(c3, c4))
  return lo, hi


def bilinear_midrad(op, a: Any, b: Any) -> tuple[Array, Array]:
  """Bounds of ``op(A, B)`` for a bilinear ``op`` (matmul, conv) in midpoint–radius form.

  Rump's form (Rump 1999, as used in AGT, App. B):  H_mu = op(A_mu, B_mu),
  H_r = op(|A_mu|, B_r) + op(A_r, |B_mu|) + op(A_r, B_r),  result ``[H_mu - H_r, H_mu + H_r]``.
  When one operand is a point the radius terms with its radius vanish, so a concrete weight
  costs two products: ``op(A_mu, W)`` and ``op(A_r, |W|)``.
  Over-approximates the exact interval product by at most a factor 1.5 in radius.
  """
  a_iv, b_iv = isinstance(a, Interval), isinstance(b, Interval)
  am, ar = (a.center, a.radius) if a_iv else (a, None)
  bm, br = (b.center, b.radius) if b_iv else (b, None)
  mid = op(am, bm)
  rad = None
  if br is not None:
    rad = op(jnp.abs(am), br)
  if ar is not None:
    t = op(ar, jnp.abs(bm))
    rad = t if rad is None else rad + t
    if br is not None:
      rad = rad + op(ar, br)
  if rad is None:
    return mid, mid
  return mid - rad, mid + rad


def bilinear_signsplit(op, a: Any, b: Any) -> tuple[Array, Array]:
  """Bounds of a bilinear ``op(A, B)`` by splitting both operands into sign-definite parts.

  With a = a+ + a- (a+ = max(a, 0) in [max(al,0), max(au,0)], a- = min(a, 0) likewise) and the
  same for b, each of the four products a±·b± has sign-definite factors, so its bounds are
  single corner products and ``op`` applies to endpoint arrays (eight products in all):

    lower = op(a+_l, b+_l) + op(a+_u, b-_l) + op(a-_l, b+_u) + op(a-_u, b-_u)
    upper = op(a+_u, b+_u) + op(a+_l, b-_u) + op(a-_u, b+_l) + op(a-_l, b-_l)

  Exact (equal to the four-corner bound of every term, summed) whenever one factor of each
  term is sign-definite, e.g. post-ReLU activations or inputs in [0, 1]; sound in general.
  """
  return _signsplit(op, a, b)


def _signsplit(op, a: Any, b: Any) -> tuple[Array, Array]:
  al, au = lower_of(a), upper_of(a)
  bl, bu = lower_of(b), upper_of(b)
  apl, apu = jnp.maximum(al, 0), jnp.maximum(au, 0)   # a+ in [apl, apu], >= 0
  anl, anu = jnp.minimum(al, 0), jnp.minimum(au, 0)   # a- in [anl, anu], <= 0
  bpl, bpu = jnp.maximum(bl, 0), jnp.maximum(bu, 0)
  bnl, bnu = jnp.minimum(bl, 0), jnp.minimum(bu, 0)
  # (+)(+): min apl*bpl, max apu*bpu ; (+)(-): min apu*bnl, max apl*bnu
  # (-)(+): min anl*bpu, max anu*bpl ; (-)(-): min anu*bnu, max anl*bnl
  lo = op(apl, bpl) + op(apu, bnl) + op(anl, bpu) + op(anu, bnu)
  hi = op(apu, bpu) + op(apl, bnu) + op(anu, bpl) + op(anl, bnl)
  return lo, hi


# ----------------------------------------------------------------------------------------------
# Entry point of the transformations
# ----------------------------------------------------------------------------------------------

def _describe(leaf: Any) -> str:
  if isinstance(leaf, Interval):
    return f"Interval of shape {np.shape(leaf.lower)}"
  return type(leaf).__name__


def _leaf_problem(leaf: Any) -> str | None:
  if isinstance(leaf, Interval):
    if isinstance(leaf.lower, jax.core.Tracer) or isinstance(leaf.upper, jax.core.Tracer):
      return None
    return box_problem(leaf.lower, leaf.upper)
  if isinstance(leaf, jax.core.Tracer):
    return None
  if is_concrete_array(leaf) or isinstance(leaf, (float, complex)):
    return array_problem(leaf)
  return None                                   # ints, bools, static objects


def validate_arguments(leaves: list, *, where: str) -> None:
  """Raises `BoundError` if a flattened argument leaf cannot be bounded soundly.

  Args:
    leaves: the arguments flattened with ``is_leaf=bj.is_interval``: Intervals, arrays,
      Python scalars and static objects. Tracers (and Intervals of tracers) are skipped.
    where: the caller's name for the message, e.g. ``"bj.ibp(model.apply)"``.

  Raises:
    BoundError: for an Interval with lower > upper, NaN or ±inf endpoints, a complex dtype,
      bool mixed with numbers, different lower/upper dtypes or shapes; or a NaN in a concrete
      floating array. The message reads
      ``"<where>: argument leaf <i> (<kind>): <problem> at file.py:LINE (function)"``.
  """
  for i, leaf in enumerate(leaves):
    problem = _leaf_problem(leaf)
    if problem is not None:
      raise BoundError(f"{where}: argument leaf {i} ({_describe(leaf)}): {problem}"
                       f"{at_user_frame()}.")
