"""boundjax.core.options: each check accepts what it documents, refuses the rest with an
`OptionError` (a ``ValueError``; ``TypeError`` for unknown keywords) naming the option and the
value, and names the caller's line (this file)."""

from __future__ import annotations

import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from boundjax.core import options
from boundjax.core.options import OptionError


def test_option_error_is_a_value_error():
  assert issubclass(OptionError, ValueError)


# ----------------------------------------------------------------------------------------------
# number, integer
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("value", [0.5, 2, np.float32(1.5), np.int64(3), np.array(2.0),
                                   jnp.asarray(0.25)])
def test_number_accepts_real_scalars_and_returns_a_float(value):
  got = options.number("lr", value, positive=True)
  assert isinstance(got, float) and got == pytest.approx(float(value))


@pytest.mark.parametrize("value, kw, expected", [
    (float("nan"), {}, "a number, not NaN"),
    (float("inf"), {}, "a finite number"),
    (-float("inf"), dict(allow_inf=True), "a finite number"),
    (0.0, dict(positive=True), "a number > 0"),
    (-1e-9, dict(nonnegative=True), "a number >= 0"),
    (0.5, dict(low=1.0), "a number >= 1.0"),
    (2.0, dict(high=1.0), "a number <= 1.0"),
    ("0.1", {}, "a real number"),
    (True, {}, "a real number"),
    (np.ones(2), {}, "a real number"),
    (1 + 2j, {}, "a real number")])
def test_number_refuses_and_names_the_option_and_value(value, kw, expected):
  with pytest.raises(OptionError, match=re.escape(f"lr={value!r}: expected {expected}")) as info:
    options.number("lr", value, **kw)
  assert "test_options.py" in str(info.value)           # the caller's line


def test_number_allows_plus_inf_when_asked():
  assert options.number("clip", float("inf"), allow_inf=True) == math.inf


@pytest.mark.parametrize("value", [0, 3, np.int32(7), np.int64(-2)])
def test_integer_accepts_integers(value):
  got = options.integer("k", value)
  assert isinstance(got, int) and got == int(value)


@pytest.mark.parametrize("value, kw, expected", [
    (2.5, {}, "an integer"), (2.0, {}, "an integer"), (True, {}, "an integer"),
    ("3", {}, "an integer"), (0, dict(minimum=1), "an integer >= 1"),
    (5, dict(maximum=4), "an integer <= 4"), (5, dict(minimum=0, maximum=4),
                                              r"an integer in \[0, 4\]")])
def test_integer_refuses_and_names_the_option_and_value(value, kw, expected):
  with pytest.raises(OptionError, match=rf"k={value!r}: expected {expected}"):
    options.integer("k", value, **kw)


# ----------------------------------------------------------------------------------------------
# finite_array
# ----------------------------------------------------------------------------------------------

def test_finite_array_names_the_first_bad_index_and_the_count():
  x = np.zeros((3, 4))
  x[1, 2], x[2, 0] = np.nan, np.inf
  with pytest.raises(OptionError, match=r"x: 2 entries are NaN or infinite \(first: NaN at "
                                        r"index \(1, 2\)\)"):
    options.finite_array("x", x)
  with pytest.raises(OptionError, match=r"x: 1 entries .*first: -inf at index \(0,\)"):
    options.finite_array("x", [-np.inf, 1.0])
  with pytest.raises(OptionError, match=r"x: expected a numeric array, got dtype <U1"):
    options.finite_array("x", np.array(["a"]))


def test_finite_array_passes_finite_integer_bool_and_traced_values():
  x = np.arange(6.0).reshape(2, 3)
  assert options.finite_array("x", x) is x
  options.finite_array("x", np.arange(4))
  options.finite_array("x", np.array([True, False]))
  # a tracer's values cannot be read: it passes (the checks are for what a user passes in)
  jax.jit(lambda a: options.finite_array("x", a) * 2)(jnp.asarray([np.nan]))


# ----------------------------------------------------------------------------------------------
# labels
# ----------------------------------------------------------------------------------------------

def test_class_labels():
  options.class_labels("y", np.array([0, 1, 2]), 3)
  options.class_labels("y", np.array([0.0, 2.0]), 3)          # integral floats
  for bad in (3, -1, 1.5, np.nan):
    y = np.array([0, 1, bad], dtype=np.float64 if isinstance(bad, float) else np.int64)
    with pytest.raises(OptionError, match=rf"y: label {y[2].item()!r} at index \(2,\) is not a "
                                          r"class of a network with 3 outputs \(expected an "
                                          r"integer in 0 \.\. 2; 1 such labels\)"):
      options.class_labels("y", y, 3)
  with pytest.raises(OptionError, match="class labels must be integers, got dtype <U1"):
    options.class_labels("y", np.array(["a"]), 3)


def test_binary_labels_and_labels_in():
  options.binary_labels("y", np.array([0, 1, 1.0]))
  with pytest.raises(OptionError, match=r"y: binary cross-entropy labels must be 0 or 1, got 2 at "
                                        r"index \(1,\) \(1 such labels\)"):
    options.binary_labels("y", np.array([0, 2]))
  options.labels_in("y", np.array([-1, 1, 0]), (-1, 0, 1), "logistic")
  with pytest.raises(OptionError, match=r"y: logistic labels must be one of -1, 0, 1, got 0\.5 "
                                        r"at index \(2,\) \(1 such labels\)"):
    options.labels_in("y", np.array([-1.0, 1.0, 0.5]), (-1, 0, 1), "logistic")


# ----------------------------------------------------------------------------------------------
# index_array
# ----------------------------------------------------------------------------------------------

def test_index_array_accepts_integer_indices_in_range_and_empty_lists():
  got = options.index_array("rows", [3, -1, 0], minimum=-1, maximum=9)
  assert got.dtype == np.int64 and got.tolist() == [3, -1, 0]
  assert options.index_array("rows", [], minimum=0).shape == (0,)
  assert options.index_array("rows", np.array([[1, 2]], np.int32)).shape == (1, 2)


@pytest.mark.parametrize("value, message", [
    ([1.7], r"rows: expected integer indices in \[-1, 9\], got 1\.7 at position \(0,\)"),
    ([1, 2.5], r"rows: expected integer indices in \[-1, 9\], got 2\.5 at position \(1,\)"),
    ([[1.0]], r"rows: expected integer indices .*got 1\.0 at position \(0, 0\)"),
    ([True], r"rows: expected integer indices .*got True"),
    ([10], r"rows: index 10 at position \(0,\) is out of range \(expected an integer in "
           r"\[-1, 9\]; 1 such indices\)"),
    ([[0, -2], [-3, 1]], r"rows: index -2 at position \(0, 1\) is out of range .*2 such")])
def test_index_array_refuses_non_integers_and_indices_out_of_range(value, message):
  with pytest.raises(OptionError, match=message):
    options.index_array("rows", value, minimum=-1, maximum=9)


# ----------------------------------------------------------------------------------------------
# one_of, no_unknown_keywords
# ----------------------------------------------------------------------------------------------

def test_one_of():
  assert options.one_of("bounds", "ibp", ("ibp", "crown")) == "ibp"
  with pytest.raises(OptionError, match=r"bounds='lp': expected one of 'ibp', 'crown'"):
    options.one_of("bounds", "lp", ("ibp", "crown"))


def test_no_unknown_keywords():
  options.no_unknown_keywords("f", {"a": 1}, ("a", "b"))
  with pytest.raises(TypeError, match=r"f\(\) got unexpected keyword argument\(s\) 'mu', 'z'; "
                                      r"it takes a, b"):
    options.no_unknown_keywords("f", {"a": 1, "mu": 2, "z": 3}, ("a", "b"))
  with pytest.raises(TypeError, match=r"f\(\) got unexpected keyword argument\(s\) 'mu' with "
                                      r"kind='tanh'; it takes a, b"):
    options.no_unknown_keywords("f", {"mu": 2}, ("a", "b"), case="kind='tanh'")
  with pytest.raises(TypeError, match="it takes none"):
    options.no_unknown_keywords("f", {"mu": 2}, ())
