"""The one classification of primitives (`boundjax.core.primitives`) and the tables that read it.

Every domain's table and the MILP encoder must agree with the classification: a linear primitive
is transposed exactly by CROWN (never bounded by its interval), passed through by the difference
domain, and encoded as an affine map by the MILP compiler; every name in every table is a JAX
primitive (or one of boundjax's own composite markers).
"""

from __future__ import annotations

import gc

import jax
import jax.numpy as jnp
import jax.scipy  # noqa: F401  (registers its primitives)
import numpy as np
import pytest
from jax import lax
from jax.extend.core import Primitive

import boundjax as bj
from boundjax.core import primitives as P
from boundjax.domains import difference as diff_domain
from boundjax.domains import interval as interval_domain
from boundjax.domains.linear import rules as crown_rules


def _jax_primitive_names() -> set[str]:
  return {o.name for o in gc.get_objects() if isinstance(o, Primitive)}


def _ours(name: str) -> bool:
  """boundjax's own composite markers (softmax, log_softmax, ...), matched by identity."""
  return name.startswith("boundjax_")


def test_every_classified_name_is_a_jax_primitive():
  known = _jax_primitive_names()
  for group in (P.LINEAR, P.BILINEAR, P.MAX_MIN, P.PIECEWISE_CONSTANT, P.KEEPS_NONNEG,
                P.ONE_TO_ONE, P.MIXING):
    assert not sorted(group - known), sorted(group - known)


@pytest.mark.parametrize("table", ["interval", "difference", "crown"])
def test_every_table_key_is_a_jax_primitive(table):
  keys = {"interval": interval_domain.RULES, "difference": diff_domain.RULES,
          "crown": crown_rules.OPS}[table]
  known = _jax_primitive_names()
  stray = sorted(k for k in keys if k not in known and not _ours(k))
  assert not stray, f"{table} table keys that are not JAX primitives: {stray}"


def test_the_classes_are_disjoint():
  groups = [P.DATA_MOVEMENT, P.ARITHMETIC_LINEAR, P.BILINEAR, P.MAX_MIN, P.PIECEWISE_CONSTANT]
  for i, a in enumerate(groups):
    for b in groups[i + 1:]:
      assert not a & b, sorted(a & b)
  assert P.kind("reshape") == "data_movement" and P.kind("exp") == "other"


def test_crown_transposes_every_linear_primitive_exactly():
  """A linear primitive with an interval rule is affine in CROWN (or rewritten into affine
  equations: split, optimization_barrier), and an affine CROWN record is a linear primitive."""
  rewritten = set(crown_rules._ONE_PER_OUTPUT)
  for name in sorted(P.LINEAR & set(interval_domain.RULES)):
    rec = crown_rules.OPS.get(name)
    assert name in rewritten or (rec is not None and rec.kind == "affine"), name
  for name, rec in crown_rules.OPS.items():
    if rec.kind == "affine":
      assert name in P.LINEAR, name
    if rec.exact_transpose:
      assert name in P.DATA_MOVEMENT or name == "neg" or name == "reduce_sum", name
    if rec.kind == "bilinear":
      assert name in P.BILINEAR or name == "div", name


@pytest.mark.parametrize("table", ["interval", "difference", "crown"])
def test_every_table_has_every_linear_bilinear_and_max_min_primitive(table):
  """The tables are built from the classification: every primitive it calls linear, bilinear or
  a maximum/minimum has a rule (CROWN: a record, or a rewrite into equations that have one)."""
  keys = {"interval": set(interval_domain.RULES), "difference": set(diff_domain.RULES),
          "crown": set(crown_rules.OPS) | set(crown_rules._ONE_PER_OUTPUT)}[table]
  missing = sorted((P.LINEAR | P.BILINEAR | P.MAX_MIN) - keys)
  assert not missing, f"{table} has no rule for {missing}"


@pytest.mark.parametrize("transform", ["ibp", "crown", "difference"])
def test_identities_pass_values_through(transform):
  """Copies and placement hints (`P.IDENTITY`) are the identity in every domain: ``x - hint(x)``
  is bounded by 0 where the domain keeps the correlation (CROWN), and the box itself
  passes through unchanged."""
  one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  hints = lambda x: (jax.device_put((x, 2 * x))[1],
                     lax.with_sharding_constraint(x, one), lax.copy_p.bind(x))
  if transform == "difference":
    fn = lambda p, x: hints(x * p)
    w = jnp.ones(6)
    out = bj.difference(fn)(w, w, BOX)
    outs = [o.ref for o in out]
  else:
    outs = list(getattr(bj, transform)(hints)(BOX))
  for o, scale in zip(outs, (2.0, 1.0, 1.0)):
    np.testing.assert_array_equal(np.asarray(o.lower), scale * np.asarray(BOX.lower))
    np.testing.assert_array_equal(np.asarray(o.upper), scale * np.asarray(BOX.upper))
  if transform == "crown":
    out = bj.crown(lambda x: hints(x)[0] - 2 * hints(x)[1] + hints(x)[2] - x)(BOX)
    np.testing.assert_allclose(np.asarray(out.lower), 0.0, atol=1e-6)
    np.testing.assert_allclose(np.asarray(out.upper), 0.0, atol=1e-6)


def test_milp_encoder_reads_the_classification():
  from milp import network
  assert network._LINEAR_PRIMITIVES == P.LINEAR
  assert network._BILINEAR_PRIMITIVES == P.BILINEAR
  assert network._ORDER_PRIMITIVES == P.PIECEWISE_CONSTANT
  assert network._KEEPS_NONNEG == P.KEEPS_NONNEG


BOX = bj.Interval(jnp.asarray([[-1.0, 0.5, -2.0, 0.0, 1.0, -0.5]]),
                  jnp.asarray([[1.0, 2.0, -1.0, 0.5, 3.0, 0.5]]))

EXACT_CANCELLATIONS = {
    # each function is identically zero; CROWN must prove it (IBP cannot): the primitive is
    # treated as the linear map it is, never by its interval
    "split": lambda x: jnp.split(x, [2, 5], axis=1)[1] - x[:, 2:5],
    "optimization_barrier": lambda x: lax.optimization_barrier((x, 3 * x))[1] - 3 * x,
    "dynamic_update_slice": lambda x: (lax.dynamic_update_slice(x, -x[:, :2], (0, 3))
                                       - jnp.concatenate([x[:, :3], -x[:, :2], x[:, 5:]], -1)),
    "scatter": lambda x: (x.at[:, jnp.array([4, 1])].set(2 * x[:, :2], unique_indices=True)
                          - jnp.stack([x[:, 0], 2 * x[:, 1], x[:, 2], x[:, 3], 2 * x[:, 0],
                                       x[:, 5]], -1)),
    "scatter-add": lambda x: (x.at[:, jnp.array([0, 0])].add(x[:, 4:6])
                              - jnp.concatenate([x[:, :1] + x[:, 4:5] + x[:, 5:6], x[:, 1:]], -1)),
}


@pytest.mark.parametrize("name", sorted(EXACT_CANCELLATIONS))
@pytest.mark.parametrize("sound", [False, True])
def test_crown_is_exact_through_data_movement(name, sound):
  fn = EXACT_CANCELLATIONS[name]
  ibp = bj.ibp(fn)(BOX)
  assert float(jnp.max(ibp.upper - ibp.lower)) > 0.5  # the case needs the linear treatment
  out = jax.jit(bj.crown(fn, sound=sound))(BOX)
  tol = 1e-4 if sound else 0.0  # sound mode rounds outward
  np.testing.assert_allclose(np.asarray(out.lower), 0.0, atol=tol)
  np.testing.assert_allclose(np.asarray(out.upper), 0.0, atol=tol)
  assert np.all(np.asarray(out.lower) <= 0) and np.all(np.asarray(out.upper) >= 0)
