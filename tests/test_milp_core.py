"""Soundness tests for the MILP layer: bounds, encoding, solving, neighbourhoods, extraction.

Every VERIFIED answer is checked against >= 10,000 sampled points (plus box corners and, for
hyper-networks, sampled member networks including vertices); every counterexample is replayed.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from boundjax.core import options
from boundjax.core.interval import Interval
from milp import bounds as B
from milp import network as N
from milp import neighbourhoods as NB
from milp import verify as V
from milp.encode import Encoding
from milp.solve import SolveConfig, solve


def rand_net(rng, sizes, width=0.0, out="logits"):
  lo, hi = [], []
  for a, b in zip(sizes[:-1], sizes[1:]):
    w = rng.normal(size=(b, a)) / np.sqrt(a)
    bb = rng.normal(size=b) * 0.1
    r, rb = width * rng.random((b, a)), width * rng.random(b)
    lo.append((w - r, bb - rb))
    hi.append((w + r, bb + rb))
  return N.interval_network(lo, hi, output=out)


def sample_members(rng, hyper, n, vertices=False):
  """Concrete networks inside the hyper-network's box (uniform or at vertices)."""
  nets = []
  for _ in range(n):
    layers = []
    for l in hyper.layers:
      if vertices:
        tw = (rng.random(l.w_lower.shape) < 0.5).astype(float)
        tb = (rng.random(l.b_lower.shape) < 0.5).astype(float)
      else:
        tw, tb = rng.random(l.w_lower.shape), rng.random(l.b_lower.shape)
      layers.append(N.AffineLayer.point(l.w_lower + tw * (l.w_upper - l.w_lower),
                                        l.b_lower + tb * (l.b_upper - l.b_lower)))
    nets.append(N.Network(tuple(layers), hyper.input_shape, hyper.output))
  return nets


def min_margin(net, nbhd, label, rng, n=10_000):
  pts = np.concatenate([nbhd.sample(n, rng), nbhd.sample(2000, rng, corners=True)])
  return N.margins(net, N.forward_batch(net, pts), label).min()


def label_at(net, x):
  c = net if net.is_point else net.center()
  return int(N.classify(c, N.forward(c, x)[None])[0])


# ------------------------------------------------------------------------------------------------
# Bounds
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("method", ["ibp", "crown"])
def test_bounds_contain_sampled_preactivations_interval_weights_any_sign(method):
  rng = np.random.default_rng(1)
  for trial in range(6):
    hyper = rand_net(rng, [3, 6, 6, 2], width=0.05 * (trial % 3))
    lo = rng.uniform(-1, 0.5, 3)
    hi = lo + rng.uniform(0, 1, 3)
    bnds = B.compute(hyper, lo, hi, method)
    for net in sample_members(rng, hyper, 20) + sample_members(rng, hyper, 20, vertices=True):
      xs = np.concatenate([rng.uniform(lo, hi, (500, 3)), np.where(rng.random((100, 3)) < .5, lo, hi)])
      h = xs
      for m, layer in enumerate(net.layers):
        z = h @ layer.w_lower.T + layer.b_lower
        L, U = bnds[m]
        assert np.all(z >= L) and np.all(z <= U), (method, trial, m)
        h = np.maximum(z, 0)


@pytest.mark.slow
def test_layer_ibp_is_inside_bj_ibp_on_the_flax_model():
  """Sign-split per-layer IBP (exact per layer for inputs >= 0) lies inside `bj.ibp`'s bounds."""
  import boundjax as bj  # an in-repo API: missing must fail, not skip
  from boundjax.models import MLP
  model = MLP(hidden=(8, 8), out=2)
  p = model.init(jax.random.PRNGKey(3), jnp.zeros((1, 5)))
  hp = jax.tree_util.tree_map(lambda a: Interval(a - 0.02, a + 0.02), p)
  x = np.random.default_rng(0).random(5).astype(np.float32)
  box = Interval.around(jnp.asarray(x), 0.1, domain=(0.0, 1.0))
  out = bj.ibp(model.apply)(hp, Interval(box.lower[None], box.upper[None]))
  L, U = B.ibp(N.from_params(hp), np.asarray(box.lower), np.asarray(box.upper))[-1]
  assert np.all(L >= np.asarray(out.lower)[0] - 1e-6)
  assert np.all(U <= np.asarray(out.upper)[0] + 1e-6)


def test_crown_at_least_as_tight_as_ibp():
  rng = np.random.default_rng(2)
  net = rand_net(rng, [4, 16, 16, 16, 2])
  x = rng.random(4)
  ib = B.ibp(net, x - 0.2, x + 0.2)
  cr = B.crown(net, x - 0.2, x + 0.2)
  for (l1, u1), (l2, u2) in zip(ib, cr):
    assert np.all(l2 >= l1) and np.all(u2 <= u1)
  assert B.count_unstable(cr) <= B.count_unstable(ib)
  assert sum((u1 - l1).sum() for l1, u1 in ib) > sum((u2 - l2).sum() for l2, u2 in cr)


# ------------------------------------------------------------------------------------------------
# Verification of concrete networks
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("solver", ["scip", "highs"])
def test_verified_never_disagrees_with_sampling_and_counterexamples_replay(solver):
  rng = np.random.default_rng(3)
  counts = {"VERIFIED": 0, "FALSIFIED": 0}
  for trial in range(12):
    sign = trial % 2 == 0
    net = rand_net(rng, [2, 8, 8, 1 if sign else 2], out="sign" if sign else "logits")
    x = rng.random(2)
    y = label_at(net, x)
    nbhd = NB.linf_ball(x, 0.3)
    r = V.verify(net, nbhd, y, SolveConfig(solver=solver), samples=0,
                 use_bounds_shortcut=False, bounds="crown" if trial % 3 == 0 else "ibp")
    mm = min_margin(net, nbhd, y, rng)
    counts[r.status.value] = counts.get(r.status.value, 0) + 1
    if r.status == V.Status.VERIFIED:
      assert mm > 0, (trial, mm)
    elif r.status == V.Status.FALSIFIED:
      assert nbhd.contains(r.counterexample)
      out = N.forward(net, r.counterexample)[None]
      assert N.classify(net, out)[0] != y
      assert N.margins(net, out, y)[0] == pytest.approx(r.counterexample_margin)
    else:
      pytest.fail(f"unexpected {r.status} on a tiny network: {r.note}")
    if mm <= 0:  # sampling found a violation: must not be verified
      assert r.status != V.Status.VERIFIED
  assert counts["VERIFIED"] >= 2 and counts["FALSIFIED"] >= 2, counts


def test_three_classes_one_milp_per_competing_class():
  rng = np.random.default_rng(16)
  seen = set()
  for trial in range(8):
    net = rand_net(rng, [2, 8, 8, 3])
    x = rng.random(2)
    y = label_at(net, x)
    nbhd = NB.linf_ball(x, 0.25)
    r = V.verify(net, nbhd, y, samples=0, use_bounds_shortcut=False)
    seen.add(r.status.value)
    mm = min_margin(net, nbhd, y, rng)
    assert r.status in (V.Status.VERIFIED, V.Status.FALSIFIED)
    if r.status == V.Status.VERIFIED:
      assert mm > 0
    else:
      assert nbhd.contains(r.counterexample)
      assert N.classify(net, N.forward(net, r.counterexample)[None])[0] != y
  assert seen == {"VERIFIED", "FALSIFIED"}


def test_bounds_shortcut_and_sampling_fast_paths_are_sound():
  rng = np.random.default_rng(4)
  for trial in range(10):
    net = rand_net(rng, [2, 8, 8, 2])
    x = rng.random(2)
    y = label_at(net, x)
    nbhd = NB.linf_ball(x, 0.05 + 0.1 * (trial % 3))
    r = V.verify(net, nbhd, y)
    mm = min_margin(net, nbhd, y, rng)
    assert r.status in (V.Status.VERIFIED, V.Status.FALSIFIED)
    if r.status == V.Status.VERIFIED:
      assert mm > 0
    else:
      assert nbhd.contains(r.counterexample)
      assert N.margins(net, N.forward(net, r.counterexample)[None], y)[0] <= 0


def test_membership_and_sensitive_discrete_neighbourhoods():
  rng = np.random.default_rng(5)
  for trial in range(8):
    net = rand_net(rng, [5, 8, 8, 2])
    x = rng.random(5)
    x[0] = float(trial % 2)
    y = label_at(net, x)
    assert V.verify(net, NB.membership(x), y).status == V.Status.VERIFIED
    assert V.verify(net, NB.membership(x), 1 - y).status == V.Status.FALSIFIED
    # sex-like binary feature 0 and a cos/sin pair at 3 admissible points (coordinates 1, 2)
    pts = np.array([[np.cos(np.pi / 2 * i / 2), np.sin(np.pi / 2 * i / 2)] for i in range(3)])
    x[1:3] = pts[trial % 3]
    y = label_at(net, x)
    for idx, vals in ((0, [0.0, 1.0]), ((1, 2), pts)):
      nbhd = NB.sensitive(x, idx, vals)
      r = V.verify(net, nbhd, y, samples=0, use_bounds_shortcut=False)
      # exhaustive: every admissible value
      grid = np.repeat(x[None], len(vals), 0)
      grid[:, list(np.atleast_1d(idx))] = np.asarray(vals).reshape(len(vals), -1)
      ok = np.all(N.classify(net, N.forward_batch(net, grid)) == y)
      assert r.status in (V.Status.VERIFIED, V.Status.FALSIFIED)
      assert (r.status == V.Status.VERIFIED) == ok
      if r.status == V.Status.FALSIFIED:
        assert nbhd.contains(r.counterexample)


@pytest.mark.parametrize("label, msg", [
    (1.5, r"label=1.5: expected an integer in \[0, 2\]"),      # was truncated to class 1
    (3, r"label=3: expected an integer in \[0, 2\]"),
    (-1, r"label=-1: expected an integer in \[0, 2\]"),
    (1.0, r"label=1.0: expected an integer"),
    (True, r"label=True: expected an integer")])
def test_verify_label_must_be_a_class_index_of_the_network(label, msg):
  rng = np.random.default_rng(0)
  net = rand_net(rng, [4, 6, 3])
  nbhd = NB.linf_ball(rng.random(4), 0.05)
  with pytest.raises(options.OptionError, match=msg):
    V.verify(net, nbhd, label)
  with pytest.raises(options.OptionError, match=r"label=2: expected an integer in \[0, 1\]"):
    V.verify(rand_net(rng, [4, 6, 1], out="sign"), nbhd, 2)     # a sign network: 0 or 1


def test_verify_checks_samples_seed_and_bounds():
  rng = np.random.default_rng(0)
  net = rand_net(rng, [4, 6, 3])
  nbhd = NB.linf_ball(rng.random(4), 0.05)
  with pytest.raises(options.OptionError, match=r"samples=-1: expected an integer >= 0"):
    V.verify(net, nbhd, 0, samples=-1)
  with pytest.raises(options.OptionError, match=r"seed=0.5: expected an integer"):
    V.verify(net, nbhd, 0, seed=0.5)
  with pytest.raises(options.OptionError, match=r"bounds='lp': expected one of 'ibp', 'crown'"):
    V.verify(net, nbhd, 0, bounds="lp")


def test_unknown_on_tiny_time_limit():
  rng = np.random.default_rng(6)
  net = rand_net(rng, [20, 64, 64, 64, 2])
  x = rng.random(20)
  nbhd = NB.linf_ball(x, 0.5)
  r = V.verify(net, nbhd, label_at(net, x), SolveConfig(time_limit=1e-3), samples=0,
               use_bounds_shortcut=False)
  assert r.status == V.Status.UNKNOWN
  assert r.margin_bound == -np.inf


def test_optimisation_dual_bound_dominates_sampled_maximum():
  rng = np.random.default_rng(7)
  for trial in range(4):
    net = rand_net(rng, [3, 8, 8, 2], width=0.02 * (trial % 2))
    x = rng.random(3)
    nbhd = NB.linf_ball(x, 0.3)
    coeffs = np.array([1.0, -1.0])
    res = V.max_output(net, nbhd, coeffs)
    members = [net] if net.is_point else sample_members(rng, net, 30) + sample_members(
        rng, net, 30, vertices=True)
    pts = np.concatenate([nbhd.sample(10_000, rng), nbhd.sample(1000, rng, corners=True)])
    best = max((N.forward_batch(m, pts) @ coeffs).max() for m in members)
    assert res.bound >= best - 1e-9
    assert res.incumbent <= res.bound + 1e-6


def test_cpsat_refuses_continuous_models_and_accepts_integer_ones():
  enc = Encoding()
  x = enc.add_variables([0.0], [1.0])
  with pytest.raises(ValueError, match="CP-SAT"):
    solve(enc, SolveConfig(solver="cpsat"))
  enc = Encoding()
  a = enc.add_binaries(3)
  enc.add_rows(np.zeros(3), a, np.ones(3), [-np.inf], [2.0])
  enc.set_objective(a, [1.0, 2.0, 3.0], maximize=True)
  out = solve(enc, SolveConfig(solver="cpsat"))
  assert out.reason == "OPTIMAL" and out.dual_bound == pytest.approx(5.0)
  del x


# ------------------------------------------------------------------------------------------------
# Hyper-networks
# ------------------------------------------------------------------------------------------------

def test_zero_width_hyper_network_matches_concrete_milp():
  rng = np.random.default_rng(8)
  key = jax.random.PRNGKey(0)
  from boundjax.models import MLP
  model = MLP(hidden=(8, 8), out=2)
  for trial in range(6):
    params = model.init(jax.random.fold_in(key, trial), jnp.zeros((1, 3)))
    net = N.from_params(params)
    hyper = N.from_params(jax.tree_util.tree_map(lambda a: Interval(a, a), params))
    x = rng.random(3)
    y = label_at(net, x)
    nbhd = NB.linf_ball(x, 0.25)
    rc = V.verify(net, nbhd, y, samples=0, use_bounds_shortcut=False)
    rh = V.verify(hyper, nbhd, y, samples=0, use_bounds_shortcut=False,
                  point_rows_as_equalities=False, replay=[net])
    assert rc.status == rh.status, (trial, rc.status, rh.status)


def test_hyper_network_verified_is_sound_for_sampled_members_and_witness_is_a_member():
  rng = np.random.default_rng(9)
  seen = set()
  for trial in range(14):
    sign = trial % 2 == 0
    hyper = rand_net(rng, [2, 8, 8, 1 if sign else 2], width=0.03,
                     out="sign" if sign else "logits")
    x = rng.random(2)
    y = label_at(hyper, x)
    nbhd = NB.linf_ball(x, 0.1)
    r = V.verify(hyper, nbhd, y, samples=0, use_bounds_shortcut=False)
    seen.add(r.status.value)
    if r.status == V.Status.VERIFIED:
      members = sample_members(rng, hyper, 10) + sample_members(rng, hyper, 10, vertices=True)
      for m in members:
        assert min_margin(m, nbhd, y, rng, n=1000) > 0
    elif r.status == V.Status.NOT_VERIFIED:
      assert N.contains(hyper, r.witness, tol=1e-9)
      assert nbhd.contains(r.counterexample)
      out = N.forward(r.witness, r.counterexample)[None]
      assert N.margins(hyper, out, y)[0] <= 1e-6
    else:
      pytest.fail(f"{r.status}: {r.note}")
  assert seen == {"VERIFIED", "NOT_VERIFIED"}


def test_hyper_counterexample_is_falsified_only_through_a_real_member():
  rng = np.random.default_rng(10)
  for _ in range(20):
    hyper = rand_net(rng, [2, 8, 8, 2], width=0.05)
    x = rng.random(2)
    y = label_at(hyper, x)
    nbhd = NB.linf_ball(x, 0.2)
    r = V.verify(hyper, nbhd, y, samples=0)
    if r.status != V.Status.NOT_VERIFIED:
      continue
    # the witness is a real network once we call it one: replay makes it FALSIFIED
    r2 = V.verify(hyper, nbhd, y, samples=0, replay=[r.witness])
    assert r2.status in (V.Status.FALSIFIED, V.Status.NOT_VERIFIED)
    if r2.status == V.Status.FALSIFIED:
      assert N.classify(hyper, N.forward(r.witness, r2.counterexample)[None])[0] != y
      return
  pytest.fail("no hyper-network counterexample confirmed through its witness")


def test_widened_encoding_is_sound_for_negative_inputs_and_plain_form_is_not():
  rng = np.random.default_rng(11)
  hyper = rand_net(rng, [3, 6, 2], width=0.3)
  layer = hyper.layers[0]
  lo, hi = np.array([-1.0, -0.5, 0.2]), np.array([0.5, 1.0, 0.9])
  pen = (layer.w_upper - layer.w_lower) @ np.maximum(0, -lo)
  plain_violations = 0
  for net in sample_members(rng, hyper, 50) + sample_members(rng, hyper, 50, vertices=True):
    xs = rng.uniform(lo, hi, (200, 3))
    z = xs @ net.layers[0].w_lower.T + net.layers[0].b_lower
    low = xs @ layer.w_lower.T + layer.b_lower
    up = xs @ layer.w_upper.T + layer.b_upper
    assert np.all(z >= low - pen - 1e-12) and np.all(z <= up + pen + 1e-12)
    plain_violations += int(np.sum((z < low - 1e-12) | (z > up + 1e-12)))
  assert plain_violations > 0  # the non-widened pair would cut off real networks
  # end to end: VERIFIED over a box with negative inputs holds for sampled members
  for trial in range(8):
    h = rand_net(rng, [3, 8, 8, 2], width=0.02)
    x = rng.uniform(-1, 1, 3)
    y = label_at(h, x)
    nbhd = NB.linf_ball(x, 0.3, domain=None)
    r = V.verify(h, nbhd, y, samples=0, use_bounds_shortcut=False)
    if r.status == V.Status.VERIFIED:
      for m in sample_members(rng, h, 10) + sample_members(rng, h, 10, vertices=True):
        assert min_margin(m, nbhd, y, rng, n=1000) > 0


# ------------------------------------------------------------------------------------------------
# Extraction and encoding plumbing
# ------------------------------------------------------------------------------------------------

def test_from_flax_mlp_and_conv_match_model_apply_and_reject_other_layers():
  import flax.linen as nn
  from boundjax.models import MLP, Conv1dNet
  xs = np.random.default_rng(12).random((6, 7))
  for model in (MLP(hidden=(8, 8), out=2), Conv1dNet()):
    p = model.init(jax.random.PRNGKey(0), jnp.zeros((1, 7)))
    net = N.from_flax(model, p, (7,))
    np.testing.assert_allclose(N.forward_batch(net, xs), np.asarray(model.apply(p, xs)),
                               atol=1e-5)
    if isinstance(model, MLP):  # interval parameters (a hyper-network) through the same route
      hp = jax.tree_util.tree_map(lambda a: Interval(a - 0.01, a + 0.01), p)
      assert N.contains(N.from_flax(model, hp, (7,)), net)

  class WithNorm(nn.Module):
    @nn.compact
    def __call__(self, x):
      return nn.Dense(2)(nn.LayerNorm()(nn.Dense(4)(x)))

  class WithTanh(nn.Module):
    @nn.compact
    def __call__(self, x):
      return nn.Dense(2)(nn.tanh(nn.Dense(4)(x)))

  for bad, msg in ((WithNorm(), "'square' is not affine.*WithNorm"), (WithTanh(), "'tanh'.*WithTanh")):
    with pytest.raises(ValueError, match=msg):
      N.from_flax(bad, bad.init(jax.random.PRNGKey(0), jnp.zeros((1, 7))), (7,))


def test_conv2d_becomes_sparse_affine_map_and_milp_verifies_soundly():
  import flax.linen as nn

  class Tiny(nn.Module):
    @nn.compact
    def __call__(self, x):
      h = nn.relu(nn.Conv(2, (3, 3), strides=(2, 2), padding="SAME")(x))
      return nn.Dense(2)(h.reshape((h.shape[0], -1)))

  model = Tiny()
  p = model.init(jax.random.PRNGKey(1), jnp.zeros((1, 6, 6, 1)))
  net = N.from_flax(model, p, (6, 6, 1))
  rng = np.random.default_rng(13)
  xs = rng.random((4, 6, 6, 1))
  np.testing.assert_allclose(N.forward_batch(net, xs), np.asarray(model.apply(p, xs)), atol=1e-5)
  x = rng.random(36)
  y = label_at(net, x)
  nbhd = NB.linf_ball(x, 0.05)
  r = V.verify(net, nbhd, y, samples=0, use_bounds_shortcut=False)
  assert r.status in (V.Status.VERIFIED, V.Status.FALSIFIED)
  if r.status == V.Status.VERIFIED:
    assert min_margin(net, nbhd, y, rng) > 0


def test_shared_inputs_two_networks_and_extra_rows():
  """Two networks on one input vector; a later module adds rows and maximises (LUCID §2.4)."""
  rng = np.random.default_rng(14)
  n1 = rand_net(rng, [2, 6, 2])
  n2 = rand_net(rng, [2, 6, 2])
  nbhd = NB.linf_ball(rng.random(2), 0.3)
  enc = Encoding()
  x = enc.add_input(nbhd)
  v1 = enc.add_network(n1, x, nbhd.lower, nbhd.upper)
  v2 = enc.add_network(n2, x, nbhd.lower, nbhd.upper)
  # maximise z2_0 - z1_0 subject to z1_1 <= z2_1 (an extra relational row)
  enc.add_rows([0, 0], [v1.outputs[1], v2.outputs[1]], [1.0, -1.0], [-np.inf], [0.0])
  from milp.solve import optimise
  res = optimise(enc, [v2.outputs[0], v1.outputs[0]], [1.0, -1.0], True, read=x)
  pts = nbhd.sample(20_000, rng)
  o1, o2 = N.forward_batch(n1, pts), N.forward_batch(n2, pts)
  ok = o1[:, 1] <= o2[:, 1]
  if ok.any():
    assert res.bound >= (o2[ok, 0] - o1[ok, 0]).max() - 1e-9
  xv = res.values
  assert nbhd.contains(xv, tol=1e-6)


def test_bad_inputs_raise_clear_errors():
  rng = np.random.default_rng(15)
  net = rand_net(rng, [2, 4, 2])
  with pytest.raises(ValueError, match="neighbourhood has 3 inputs"):
    V.verify(net, NB.membership(np.zeros(3)), 0)
  with pytest.raises(options.OptionError, match=r"label=5: expected an integer in \[0, 1\]"):
    V.verify(net, NB.membership(np.zeros(2)), 5)
  with pytest.raises(ValueError, match="radius"):
    NB.linf_ball(np.zeros(2), -0.1)
  with pytest.raises(ValueError, match="solver"):
    SolveConfig(solver="gurobi")
  with pytest.raises(ValueError, match="time_limit"):
    SolveConfig(time_limit=0.0)
  with pytest.raises(ValueError, match="lower parameter bound"):
    N.AffineLayer(np.ones((1, 1)), np.zeros((1, 1)), np.zeros(1), np.zeros(1))
  one = [(np.ones((1, 2)), np.zeros(1))]
  assert N.interval_network(one, one).output == "sign"  # one output unit: sign classifier
  with pytest.raises(ValueError, match="needs at least 2 output units"):
    N.interval_network(one, one, output="logits")
  with pytest.raises(ValueError, match="unknown method"):
    B.compute(net, np.zeros(2), np.ones(2), "deeppoly")


# ------------------------------------------------------------------------------------------------
# Tolerances: a negative or non-finite tol turns "margin > tol" into a non-proof
# ------------------------------------------------------------------------------------------------

def _always_class_1(out="logits"):
  """A point network whose class is 1 at every input (logit margin z_0 - z_1 = -0.5)."""
  w1, b1 = np.array([[1.0, -1.0], [-1.0, 1.0]]), np.zeros(2)
  if out == "sign":  # N(x) = 0.5 >= 0: class 1
    return N.interval_network([(w1, b1), (np.zeros((1, 2)), np.array([0.5]))],
                              [(w1, b1), (np.zeros((1, 2)), np.array([0.5]))])
  w2, b2 = np.array([[0.3, 0.3], [0.3, 0.3]]), np.array([0.0, 0.5])
  return N.interval_network([(w1, b1), (w2, b2)], [(w1, b1), (w2, b2)], output="logits")


@pytest.mark.parametrize("bad", [-1.0, -1e-9, float("nan"), float("inf"), float("-inf")])
def test_solve_config_rejects_bad_tol(bad):
  with pytest.raises(ValueError, match="tol"):
    SolveConfig(tol=bad)


@pytest.mark.parametrize("field", ["relative_gap", "absolute_gap"])
@pytest.mark.parametrize("bad", [-1e-6, float("nan"), float("inf")])
def test_solve_config_rejects_bad_gaps(field, bad):
  with pytest.raises(ValueError, match=field):
    SolveConfig(**{field: bad})


def test_highs_presolve_error_is_retried_without_presolve():
  """A 134-variable big-M encoding (from LUCID's MILP tightening) on which HiGHS's presolve
  fails with kError in OR-Tools 9.15: `solve` retries without presolve and gets SCIP's optimum."""
  from pathlib import Path

  from ortools.math_opt import model_pb2
  from ortools.math_opt.python import mathopt

  from milp.encode import Encoding
  from milp.solve import SolveConfig, solve

  proto = model_pb2.ModelProto.FromString(
      (Path(__file__).parent / "data" / "highs_presolve_error.pb").read_bytes())
  enc = Encoding()
  enc.model = mathopt.Model.from_model_proto(proto)
  out = solve(enc, SolveConfig(solver="highs", time_limit=60.0))
  ref = solve(enc, SolveConfig(solver="scip", time_limit=60.0))
  assert out.proven and ref.proven
  assert abs(out.dual_bound - ref.dual_bound) <= 1e-6 * (1 + abs(ref.dual_bound))


def test_solve_config_accepts_zero_tolerances():
  cfg = SolveConfig(tol=0.0, relative_gap=0.0, absolute_gap=0.0)
  assert cfg.tol == 0.0


@pytest.mark.parametrize("out", ["logits", "sign"])
def test_everywhere_misclassified_never_verified(out):
  net = _always_class_1(out)
  nbhd = NB.linf_ball(np.array([0.5, 0.4]), 0.3)
  rng = np.random.default_rng(16)
  assert min_margin(net, nbhd, 0, rng) < 0   # class 1 everywhere: label 0 is wrong everywhere
  for solver in ("scip", "highs"):
    for tol in (0.0, 1e-6, 0.1):
      for shortcut in (True, False):
        r = V.verify(net, nbhd, 0, SolveConfig(solver=solver, tol=tol), samples=0,
                     use_bounds_shortcut=shortcut)
        assert r.status != V.Status.VERIFIED, (solver, tol, shortcut, r)
        assert r.margin_bound < 0 or r.margin_bound == -np.inf
  # a config whose validation was bypassed is refused by verify itself, not trusted
  cfg = SolveConfig()
  object.__setattr__(cfg, "tol", -1.0)
  with pytest.raises(ValueError, match="tol"):
    V.verify(net, nbhd, 0, cfg, samples=0)
