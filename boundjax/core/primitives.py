"""What kind of function each JAX primitive computes: the one classification every table reads.

The interval rules (`boundjax.domains.interval`), CROWN's records (`boundjax.domains.linear`),
the difference rules (`boundjax.domains.difference`) and the MILP encoder (`milp.network`) each
decide how to treat a primitive; what they may assume about it is stated once, here, and
`tests/test_primitives.py` checks that every table agrees with it (a primitive listed as linear
here is transposed exactly by CROWN and passed through by the difference domain, and so on).

Every set holds JAX primitive names (``eqn.primitive.name``), never function names.

* `DATA_MOVEMENT`: every output entry is one input entry (or a constant fill): reshapes, slices,
  gathers, selections with concrete indices or predicates, copies. Linear in the float operands
  jointly, **exact in floating point** (no rounding), and order-preserving entrywise.
* `ARITHMETIC_LINEAR`: linear in the float operands jointly, computed with rounding: sums,
  differences, negation, scans of sums, and the float-to-float cast (the identity up to one
  rounding).
* `LINEAR` = the two above: what an encoder may treat as an affine map once every index and
  predicate operand is concrete.
* `BILINEAR`: linear in each operand when the others are concrete (``mul``, ``dot_general``,
  ``conv_general_dilated``): affine iff exactly one operand depends on the box; a product of two
  box-dependent operands needs a relaxation (McCormick planes).
* `IDENTITY` (part of `DATA_MOVEMENT`): the identity on each operand (copies, and placement or
  scheduling hints); every domain passes the value through unchanged.
* `MAX_MIN`: entrywise or windowed maxima and minima (ReLU is ``max(x, 0)``).
* `PIECEWISE_CONSTANT`: order statistics and roundings whose value is not a max/min of
  linear pieces (argmax, sort, floor, ...): neither linear nor encodable by big-M constraints
  of a max.
* `ONE_TO_ONE`: with one box-dependent operand of the result's shape (the others concrete),
  every result entry is a monotone affine function of one entry of it and no two results share
  one (permutations, crops, constant padding, entrywise shifts and scalings): the interval image
  of a box is the exact range of each entry.
* `MIXING`: linear maps that combine entries (products with a concrete matrix or kernel, sums).
* `KEEPS_NONNEG`: maps non-negative operands to non-negative results (used where an interval
  product is exact for inputs ``>= 0``, e.g. Sphynx's encoding of interval weights).
"""

from __future__ import annotations

DATA_MOVEMENT = frozenset({
    "reshape", "broadcast_in_dim", "transpose", "squeeze", "slice",
    "dynamic_slice", "dynamic_update_slice", "gather", "scatter", "concatenate", "pad", "rev",
    "select_n", "split", "copy", "stop_gradient", "optimization_barrier", "device_put",
    "sharding_constraint",
})
"""Pure data movement: linear, exact in floats."""

IDENTITY = frozenset({
    "copy", "stop_gradient", "optimization_barrier", "device_put", "sharding_constraint",
})
"""The identity on each operand (a copy, a scheduling or placement hint)."""

SEVERAL_RESULTS = frozenset({"optimization_barrier", "device_put", "split"})
"""Data movement returning a list of results (one per operand for the identities)."""

ARITHMETIC_LINEAR = frozenset({
    "add", "add_any", "sub", "neg", "reduce_sum", "reduce_window_sum", "cumsum", "scatter-add",
    "scatter-sub",
    "convert_element_type",
})
"""Linear with rounding (``neg`` is exact but changes sign, so it is not data movement)."""

LINEAR = DATA_MOVEMENT | ARITHMETIC_LINEAR
"""Jointly linear in the float operands once index and predicate operands are concrete."""

BILINEAR = frozenset({"mul", "dot_general", "conv_general_dilated"})
"""Linear in each operand when the others are concrete."""

MAX_MIN = frozenset({
    "max", "min", "reduce_max", "reduce_min", "reduce_window_max", "reduce_window_min",
})
"""Maxima and minima of their operands' entries."""

PIECEWISE_CONSTANT = frozenset({
    "argmax", "argmin", "cummax", "cummin", "sort", "reduce_precision", "round", "floor",
    "ceil", "sign",
})
"""Order statistics and roundings (``cummax``/``cummin`` are maxima of prefixes, but no encoder
here treats them as such; they are listed with the order statistics)."""

ONE_TO_ONE = frozenset({
    "reshape", "transpose", "squeeze", "slice", "pad", "rev", "copy", "stop_gradient",
    "optimization_barrier", "device_put", "sharding_constraint", "convert_element_type", "neg",
    "add", "sub", "mul", "div",
})
"""Entry to entry, with one box-dependent operand of the result's shape."""

MIXING = frozenset({"dot_general", "conv_general_dilated", "reduce_sum", "reduce_window_sum"})
"""Linear maps combining entries, with one box-dependent operand."""

KEEPS_NONNEG = DATA_MOVEMENT | BILINEAR | (ARITHMETIC_LINEAR - {"sub", "neg"})
"""Non-negative float operands give a non-negative result."""


def is_linear(name: str) -> bool:
  """Whether the primitive ``name`` is jointly linear in its float operands (`LINEAR`)."""
  return name in LINEAR


def kind(name: str) -> str:
  """``"data_movement"``, ``"arithmetic_linear"``, ``"bilinear"``, ``"max_min"``,
  ``"piecewise_constant"`` or ``"other"`` (smooth nonlinearities, comparisons, ...)."""
  for label, names in (("data_movement", DATA_MOVEMENT), ("arithmetic_linear", ARITHMETIC_LINEAR),
                       ("bilinear", BILINEAR), ("max_min", MAX_MIN),
                       ("piecewise_constant", PIECEWISE_CONSTANT)):
    if name in names:
      return label
  return "other"
