"""milp.bounds on the engine: float64 sound-mode bounds against exact rational evaluation.

The big-M constants of the MILP come from ``bj.ibp``/``bj.crown`` with ``sound=True`` in float64
(`milp.bounds`). These tests evaluate the networks in exact rational arithmetic
(`fractions.Fraction`, every float64 is a rational) and check that every exact pre-activation
lies inside its bound: on point boxes (where the bound is as tight as the float64 evaluation, so
only the outward rounding keeps it sound; the same check fails for the engine without
``sound``), and on wide boxes at >= 10^4 sampled points and corners.
"""

from __future__ import annotations

from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import boundjax as bj
from milp import bounds as B
from milp import difference as D
from milp import network as N


def rand_net(rng, sizes, width=0.0):
  layers = []
  for a, b in zip(sizes[:-1], sizes[1:]):
    w = rng.normal(size=(b, a)) / np.sqrt(a)
    bb = rng.normal(size=b) * 0.3
    layers.append(N.AffineLayer(w - width, w + width, bb - width, bb + width))
  return N.Network(tuple(layers), (sizes[0],))


def exact_pre(ws, bs, x) -> list[list[Fraction]]:
  """Exact pre-activations of the ReLU network ``(ws, bs)`` at ``x`` (rationals)."""
  h = [Fraction(float(v)) for v in x]
  out = []
  for m, (w, b) in enumerate(zip(ws, bs)):
    z = [sum((Fraction(float(w[i, j])) * h[j] for j in range(len(h))), Fraction(float(b[i])))
         for i in range(len(b))]
    out.append(z)
    h = [max(v, Fraction(0)) for v in z]
  return out


def inside(bounds, pre) -> bool:
  return all(Fraction(float(L[i])) <= z[i] <= Fraction(float(U[i]))
             for (L, U), z in zip(bounds, pre) for i in range(len(z)))


def point_layers(net):
  return [np.asarray(l.w_lower) for l in net.layers], [np.asarray(l.b_lower) for l in net.layers]


@pytest.mark.parametrize("method", ["ibp", "crown"])
def test_point_boxes_contain_the_exact_value(method):
  """Zero-width boxes: the bound is the float64 evaluation widened only by the engine's
  outward rounding; it must contain the exact rational value at every one of 300 points."""
  rng = np.random.default_rng(0)
  net = rand_net(rng, (6, 12, 12, 3))
  ws, bs = point_layers(net)
  for _ in range(300):
    x = rng.uniform(-1, 1, 6) * 10.0 ** rng.integers(-3, 3)
    bnds = B.compute(net, x, x, method)
    assert inside(bnds, exact_pre(ws, bs, x))
    for L, U in bnds:
      assert np.all(np.isfinite(L)) and np.all(np.isfinite(U)) and np.all(L <= U)


def test_point_boxes_without_sound_mode_miss_the_exact_value():
  """The check above can fail: the engine's float64 IBP *without* sound mode excludes the exact
  value of some pre-activation on some point box (rounding alone moves it outside)."""
  rng = np.random.default_rng(0)
  net = rand_net(rng, (6, 12, 12, 3))
  ws, bs = point_layers(net)
  plain = bj.ibp(B.affine_chain)
  missed = 0
  with jax.enable_x64(True):
    params = B.network_params(net)
    for _ in range(300):
      x = rng.uniform(-1, 1, 6) * 10.0 ** rng.integers(-3, 3)
      out = plain(params, bj.Interval(jnp.asarray(x), jnp.asarray(x)))
      bnds = [(np.asarray(o.lower), np.asarray(o.upper)) for o in out]
      missed += not inside(bnds, exact_pre(ws, bs, x))
  assert missed > 0


@pytest.mark.parametrize("method", ["ibp", "crown"])
@pytest.mark.parametrize("width", [0.0, 0.03])
def test_wide_boxes_sampled_and_corners_exact(method, width):
  """>= 10^4 sampled points and box corners (and, for interval weights, sampled vertex and
  interior members) evaluated exactly lie inside the bounds of every layer."""
  rng = np.random.default_rng(1)
  net = rand_net(rng, (4, 7, 5, 2), width)
  lo = rng.uniform(-1, 0.5, 4)
  hi = lo + rng.uniform(0, 1, 4)
  bnds = B.compute(net, lo, hi, method)
  corners = (np.arange(16)[:, None] >> np.arange(4)) & 1
  xs = np.concatenate([np.where(corners == 1, hi, lo), rng.uniform(lo, hi, (10_000, 4))])
  members = [point_layers(net)] if width == 0 else []
  for k in range(4 if width else 0):
    t = [rng.random(l.w_lower.shape) if k % 2 else np.round(rng.random(l.w_lower.shape))
         for l in net.layers]
    tb = [rng.random(l.b_lower.shape) for l in net.layers]
    members.append(([l.w_lower + a * (l.w_upper - l.w_lower) for l, a in zip(net.layers, t)],
                    [l.b_lower + a * (l.b_upper - l.b_lower) for l, a in zip(net.layers, tb)]))
  count = 0
  for ws, bs in members:
    for x in xs[:: max(1, len(members))]:
      assert inside(bnds, exact_pre(ws, bs, x))
      count += 1
  assert count >= 10_000


def test_crown_bounds_every_preactivation_in_one_pass_per_relu_layer():
  """Returning every pre-activation as an output adds no backward pass: the engine's CROWN
  targets (ReLU inputs and outputs, deduplicated) are exactly the L pre-activation vectors."""
  from boundjax.core import program as prog_lib
  from boundjax.domains.linear.api import _targets
  from boundjax.domains.linear.rules import classify_program, from_core
  rng = np.random.default_rng(2)
  net = rand_net(rng, (5, 8, 8, 8, 3))
  with jax.enable_x64(True):
    params = B.network_params(net)
    box = bj.Interval(jnp.zeros(5), jnp.ones(5))
    arguments = prog_lib.split_arguments((params, box), {})
    core = prog_lib.trace(B.affine_chain, arguments, precision_highest=True)
    prog = from_core(core)
    classify_program(prog, [v in core.depends for v in core.invars], True)
    targets = _targets(prog, "crown")
  assert len(targets) == len(net.layers)
  assert [t.size for t in targets] == [l.shape[0] for l in net.layers]


def test_spec_and_interval_rows_are_sound_and_crown_rows_tighter():
  """`spec_bounds` (C composed into the network) and `interval_rows` contain the exact rows at
  sampled points; the CROWN rows are never looser than the rows of the interval of ``y``."""
  rng = np.random.default_rng(3)
  net = rand_net(rng, (4, 10, 10, 3))
  ws, bs = point_layers(net)
  lo, hi = np.zeros(4), np.full(4, 0.5)
  C = np.array([[1.0, -1.0, 0.0], [0.5, 0.0, -2.0]])
  d = np.array([0.1, -0.2])
  cl, cu = B.spec_bounds(net, lo, hi, C, d, "crown")
  il, iu = B.interval_rows(C, d, *B.compute(net, lo, hi, "crown")[-1])
  assert np.all(cl >= il) and np.all(cu <= iu)
  assert np.sum(cu - cl) < np.sum(iu - il)
  for x in np.concatenate([rng.uniform(lo, hi, (2000, 4)), [lo, hi]]):
    y = exact_pre(ws, bs, x)[-1]
    rows = [sum((Fraction(float(C[r, j])) * y[j] for j in range(3)), -Fraction(float(d[r])))
            for r in range(2)]
    for r in range(2):
      assert Fraction(float(cl[r])) <= rows[r] <= Fraction(float(cu[r]))
      assert Fraction(float(il[r])) <= rows[r] <= Fraction(float(iu[r]))


def test_difference_bounds_contain_exact_differences_on_point_boxes():
  """`milp.difference` (the engine's difference domain in sound mode) on point boxes: the exact
  rational difference of a vertex member of the hyper-network and N lies inside every layer's
  pre- and post-activation interval."""
  rng = np.random.default_rng(4)
  net = rand_net(rng, (5, 8, 6, 2))
  ws, bs = point_layers(net)
  eps = 1e-3
  hyper = N.Network(tuple(N.AffineLayer(l.w_lower - eps, l.w_upper + eps, l.b_lower - eps,
                                        l.b_upper + eps) for l in net.layers), (5,))
  for trial in range(40):
    x = rng.uniform(0, 1, 5)
    db = D.difference_bounds(net, hyper, x, x)
    signs = [np.sign(rng.normal(size=w.shape)) for w in ws]
    wh = [w + eps * s for w, s in zip(ws, signs)]
    bh = [b + eps * np.sign(rng.normal(size=b.shape)) for b in bs]
    z, zh = exact_pre(ws, bs, x), exact_pre(wh, bh, x)
    for m in range(len(ws)):
      lo, hi = db.pre[m]
      for i in range(len(z[m])):
        dz = zh[m][i] - z[m][i]
        assert Fraction(float(lo[i])) <= dz <= Fraction(float(hi[i])), (trial, m, i)
        if m < len(db.post):
          pl, ph = db.post[m]
          dr = max(zh[m][i], Fraction(0)) - max(z[m][i], Fraction(0))
          assert Fraction(float(pl[i])) <= dr <= Fraction(float(ph[i])), (trial, m, i)
