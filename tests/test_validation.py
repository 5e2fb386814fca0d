"""Argument validation of the transformations (`boundjax.core.validation`) and user-frame lookup."""

import json
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import boundjax as bj
from boundjax.core.interval import validate_arguments
from boundjax.core.validation import _is_library_file, at_user_frame, first_user_frame


def _bad(lower, upper):
  return bj.Interval(lower, upper, validate=False)


GOOD = bj.Interval(jnp.zeros(2), jnp.ones(2))


@pytest.mark.parametrize("leaf,message", [
    (_bad(np.array([0.0, 2.0]), np.array([1.0, 1.0])), r"lower > upper at index \(1,\)"),
    (_bad(np.array([0.0, np.nan]), np.array([1.0, 1.0])), "lower bound is not finite"),
    (_bad(np.array([0.0, 0.0]), np.array([1.0, np.inf])), "upper bound is not finite"),
    (_bad(np.array([-np.inf, 0.0]), np.array([1.0, 1.0])), "lower bound is not finite"),
    (_bad(jnp.zeros(2, jnp.complex64), jnp.ones(2, jnp.complex64)), "complex dtype"),
    (_bad(np.zeros(2, bool), np.ones(2, np.float32)), "bool mixed with numbers"),
    (_bad(jnp.zeros(2, jnp.int32), jnp.ones(2, jnp.float32)), "lower dtype int32 differs"),
    (_bad(jnp.zeros(2), jnp.ones(3)), r"equal shapes, got \(2,\) and \(3,\)"),
    (_bad(jnp.array([3, 1]), jnp.array([2, 2])), r"lower > upper at index \(0,\)"),
    (_bad(np.array([True]), np.array([False])), "lower > upper"),
    (_bad(None, None), "not numeric arrays"),
    (jnp.array([1.0, jnp.nan]), r"array of shape \(2,\) has NaN at index \(1,\)"),
    (np.full((2, 2), np.nan, np.float32), r"has NaN at index \(0, 0\) \(4 NaN entries\)"),
    (float("nan"), "has NaN"),
    (np.float32(np.nan), "has NaN"),
])
def test_validate_arguments_rejects(leaf, message):
  leaves = [GOOD, "static", leaf, jnp.ones(3)]
  with pytest.raises(bj.BoundError, match=message) as err:
    validate_arguments(leaves, where="bj.ibp(f)")
  text = str(err.value)
  assert text.startswith("bj.ibp(f): argument leaf 2 (")
  assert re.search(r" at test_validation\.py:\d+ \(test_validate_arguments_rejects\)\.$", text)
  assert isinstance(err.value, ValueError)


def test_validate_arguments_accepts_valid_and_static_leaves():
  leaves = [GOOD, bj.Interval(jnp.array([0, 1]), jnp.array([0, 3])),
            bj.Interval(np.array([False, True]), np.array([True, True])),
            bj.Interval(np.zeros(2), jnp.ones(2)),          # float64 numpy vs float32: canonical
            jnp.array([1.0, jnp.inf]), np.arange(3), 1, 2.5, True, None, "relu", len,
            jax.random.PRNGKey(0), jax.ShapeDtypeStruct((2,), jnp.float32)]
  validate_arguments(leaves, where="bj.crown(f)")
  validate_arguments([], where="bj.difference(f)")


def test_validate_arguments_skips_tracers():
  bad = _bad(jnp.ones(2), jnp.zeros(2))

  def f(lo, hi, x):
    validate_arguments([bj.Interval(lo, hi, validate=False), x], where="bj.ibp(f)")
    return x.sum()

  nan = jnp.array([jnp.nan, 0.0])
  jax.jit(f)(bad.lower, bad.upper, nan)
  jax.vmap(f)(jnp.ones((3, 2)), jnp.zeros((3, 2)), jnp.full((3, 2), jnp.nan))
  jax.grad(f, argnums=(0, 1, 2))(bad.lower, bad.upper, nan)


def test_validate_arguments_checks_half_traced_interval_only_when_concrete():
  def f(x):
    validate_arguments([bj.Interval(x, jnp.zeros(2), validate=False)], where="w")
    return x
  jax.jit(f)(jnp.ones(2))                                  # lower is a tracer: skipped


def test_first_user_frame_is_this_line():
  line = first_user_frame()
  assert line.startswith("test_validation.py:")
  assert line.endswith("(test_first_user_frame_is_this_line)")
  assert int(line.split(":")[1].split(" ")[0]) == test_first_user_frame_is_this_line.__code__.co_firstlineno + 1


def test_at_user_frame_skips_boundjax_and_jax_frames():
  def inner(x):
    seen.append(at_user_frame())
    return x
  seen = []
  jax.jit(inner)(jnp.ones(1))                              # called from inside jax's tracing
  assert re.fullmatch(r" at test_validation\.py:\d+ \(inner\)", seen[0])
  with pytest.raises(bj.BoundError) as err:
    bj.Interval.around(jnp.zeros(2), 0.1, domain=(1.0, 0.0))   # raised two boundjax frames down
  assert f"at test_validation.py:" in str(err.value)
  assert str(err.value).endswith("(test_at_user_frame_skips_boundjax_and_jax_frames).")


def test_library_files():
  import flax
  import optax
  for mod in (jax, jnp, np, flax, optax, bj, json, os):
    assert _is_library_file(mod.__file__), mod.__name__
  assert _is_library_file("<frozen importlib._bootstrap>")
  assert not _is_library_file(__file__)
  assert not _is_library_file("<stdin>")
