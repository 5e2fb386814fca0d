"""The `Interval` type: an axis-aligned box ``lower <= x <= upper`` as a JAX pytree.

An `Interval` is the abstract value of the interval domain (IBP) and the way users describe
uncertainty: an input box, a box over parameters (a hyper-network), a box over gradients.

Construction from concrete arrays validates the box (equal shapes, finite endpoints,
``lower <= upper``) and raises `ValueError` naming the first offending position. Inside traced
code (``jit``, ``grad``, ``vmap``) validation is skipped: the values are not known yet.

The module also holds the interval matrix-product kernels (midpoint–radius "Rump" form and the
exact four-corner form), shared by the interval domain and by Abstract Gradient Training.
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array


def _is_concrete(x: Any) -> bool:
  """True when ``x`` holds known values (not a tracer)."""
  return not isinstance(x, jax.core.Tracer)


def _first_index(mask: np.ndarray) -> tuple[int, ...]:
  idx = np.argwhere(mask)
  return tuple(int(i) for i in idx[0]) if idx.size else ()


def _validate(lower: Any, upper: Any) -> None:
  """Raises `ValueError` if ``[lower, upper]`` is not a valid box (concrete values only)."""
  if not (_is_concrete(lower) and _is_concrete(upper)):
    return
  lo, hi = np.asarray(lower), np.asarray(upper)
  if lo.shape != hi.shape:
    raise ValueError(
        f"Interval: lower and upper must have equal shapes, got {lo.shape} and {hi.shape}.")
  if lo.dtype == object or hi.dtype == object:
    return  # placeholder leaves (e.g. during pytree transforms)
  for name, a in (("lower", lo), ("upper", hi)):
    if not np.issubdtype(a.dtype, np.number):
      continue
    bad = ~np.isfinite(a)
    if bad.any():
      i = _first_index(bad)
      raise ValueError(
          f"Interval: {name} bound is not finite ({a[i]!r}) at index {i} "
          f"({int(bad.sum())} non-finite entries).")
  bad = lo > hi
  if bad.any():
    i = _first_index(bad)
    raise ValueError(
        f"Interval: lower > upper at index {i} (lower={lo[i]!r}, upper={hi[i]!r}; "
        f"{int(bad.sum())} entries violate lower <= upper).")


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

  # -- pytree protocol: children are (lower, upper); unflattening never validates, because
  #    JAX transformations rebuild pytrees with placeholders and tracers.
  def tree_flatten(self):
    return (self.lower, self.upper), None

  @classmethod
  def tree_unflatten(cls, aux, children):
    del aux
    return cls(*children, validate=False)

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
      eps: radius (scalar or broadcastable array), must be >= 0.
      domain: optional ``(low, high)``, e.g. ``(0.0, 1.0)`` for normalised images.
    """
    x = jnp.asarray(x)
    eps = jnp.asarray(eps, dtype=x.dtype if jnp.issubdtype(x.dtype, jnp.floating) else None)
    if _is_concrete(eps) and np.any(np.asarray(eps) < 0):
      raise ValueError(f"Interval.around: eps must be >= 0, got {eps}.")
    lo, hi = x - eps, x + eps
    if domain is not None:
      lo = jnp.clip(lo, domain[0], domain[1])
      hi = jnp.clip(hi, domain[0], domain[1])
    return cls(lo, hi)

  @classmethod
  def from_center_radius(cls, center: Any, radius: Any) -> "Interval":
    """The box ``[center - radius, center + radius]``; ``radius`` must be >= 0."""
    center, radius = jnp.asarray(center), jnp.asarray(radius)
    if _is_concrete(radius) and np.any(np.asarray(radius) < 0):
      raise ValueError("Interval.from_center_radius: radius must be >= 0.")
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
    return (self.lower + self.upper) / 2

  @property
  def radius(self) -> Array:
    return (self.upper - self.lower) / 2

  @property
  def width(self) -> Array:
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


def is_interval(x: Any) -> bool:
  return isinstance(x, Interval)


def lower_of(x: Any) -> Any:
  """``x.lower`` for an Interval, ``x`` itself for an array."""
  return x.lower if isinstance(x, Interval) else x


def upper_of(x: Any) -> Any:
  return x.upper if isinstance(x, Interval) else x


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

  Rump's form (AGT spec §2.1):  H_mu = op(A_mu, B_mu),
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
