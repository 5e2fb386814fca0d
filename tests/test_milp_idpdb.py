"""Soundness tests of milp.idpdb: the iDP-DB node MILP, LUCID-Compute and the naive baseline.

Ground truths: hand-made families whose beta*_c is known in closed form, and small real
leave-one-out families (breast_cancer, 4 features scaled to [0, 1], a 2x8 MLP, masked SGD as
LUCID trains) where the per-member MILPs give the exact beta*_c. Every bound is attacked: BaB >=
exact, incumbents replayed in float64, and a vmapped projected-gradient search for disagreeing
inputs of high confidence (LUCID).
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from milp import bounds as bounds_lib
from milp import idpdb
from milp.difference import difference_bounds
from milp import network as net_lib
from milp.ldcp import Family, family_from_stacked
from milp.network import AffineLayer, Network

TOL = 1e-5
FAST = idpdb.IdpDbConfig(node_time_limit=300.0)  # generous: exactness must not hinge on load
PLAIN = dataclasses.replace(FAST, matching=False, matching_pre=False, relax=False)


# ------------------------------------------------------------------------------------------------
# Fixtures
# ------------------------------------------------------------------------------------------------

def _toy(biases, output="logits"):
  """N: h = relu(x) (2 inputs), logits (h1, h2) or sign h1 - h2; member i shifts by ``b_i``.

  logits: member i has logits (h1, h2 + b_i); C^0_N = x1 - x2, and member i disagrees with
  class 0 iff x1 - x2 <= b_i, so beta*_0 = max b (when <= 1) and beta*_1 = -min b.
  sign: member i outputs h1 - h2 - b_i; the same betas for classes 1 and 0.
  """
  eye = np.eye(2)
  hid = AffineLayer.point(eye, np.zeros(2))
  if output == "logits":
    out = lambda b: AffineLayer.point(eye, np.array([0.0, b]))
  else:
    out = lambda b: AffineLayer.point(np.array([[1.0, -1.0]]), np.array([-b]))
  net = Network((hid, out(0.0)), (2,), output)
  members = [Network((hid, out(b)), (2,), output) for b in biases]
  return net, members


FIG3_BIASES = [0.1, 0.0, 0.1, 0.3]   # the bias of z_{1,1} across Fig. 3's four networks


def _breast_cancer(n_points=80, n_members=12, hidden=(8, 8), epochs=40, seed=0):
  from sklearn.datasets import load_breast_cancer

  from boundjax import ensembles
  from boundjax.models import MLP
  X, y = load_breast_cancer(return_X_y=True)
  X = X[:, [0, 1, 20, 27]]
  X = (X - X.min(0)) / (X.max(0) - X.min(0))
  rows = np.random.default_rng(seed).choice(len(X), n_points, replace=False)
  X, y = X[rows].astype(np.float32), y[rows].astype(np.int32)
  model = MLP(hidden=hidden, out=2)
  init = model.init(jax.random.PRNGKey(seed), jnp.zeros((1, X.shape[1])))
  ens = ensembles.train_ensemble(model, init, ensembles.sgd(0.1, weight_decay=1e-5), X, y,
                                 ensembles.leave_k_out(np.arange(n_members)), epochs=epochs,
                                 batch_size=16, seed=seed, progress=False)
  full = ens.full
  members = jax.tree_util.tree_map(lambda a: np.asarray(a)[1:], ens.params)
  return full, members, X


@pytest.fixture(scope="module")
def real():
  full, stacked, X = _breast_cancer()
  net = net_lib.from_params(full)
  fam = family_from_stacked(stacked)
  naive = {c: idpdb.naive_compute(net, fam, c, PLAIN) for c in (0, 1)}
  return dict(full=full, stacked=stacked, net=net, fam=fam, naive=naive, X=X)


# ------------------------------------------------------------------------------------------------
# Closed-form families
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("output", ["logits", "sign"])
def test_toy_closed_form(output):
  net, members = _toy(FIG3_BIASES, output)
  top, bottom = (0, 1) if output == "logits" else (1, 0)
  for label, want in ((top, max(FIG3_BIASES)), (bottom, -min(FIG3_BIASES))):
    res = idpdb.lucid_compute(net, members, label, PLAIN, progress=False)
    assert res.exact and abs(res.beta - want) < TOL, (label, res.beta, want)
    nv = idpdb.naive_compute(net, members, label, PLAIN)
    assert nv.exact and abs(nv.beta - want) < TOL
    assert abs(res.lower - want) < TOL   # the maximiser is confirmed on a real member
    # root hyper-network: bias box [0, 0.3] gives the same bound; anytime is non-increasing
    assert res.tree[0].members.size == len(members)
    bounds = [b for _, b in res.anytime]
    assert all(a >= b - 1e-12 for a, b in zip(bounds, bounds[1:]))
    assert bounds[-1] == res.beta


def test_toy_bab_prunes_like_fig3():
  """Fig. 3: the root is split and the search stops at the singleton holding the maximum."""
  net, members = _toy(FIG3_BIASES)
  res = idpdb.lucid_compute(net, members, 0, PLAIN, progress=False)
  assert res.exact and abs(res.beta - 0.3) < TOL
  assert res.n_milps < 1 + 2 * len(members)
  popped_last = [r for r in res.tree if r.members.size == 1 and abs(r.bound - 0.3) < TOL]
  assert popped_last and int(popped_last[0].members[0]) == 3


def test_self_bound_is_not_positive():
  """Spec §3 property 13: with S = {N} itself, beta <= 0 (N cannot disagree with itself)."""
  net, _ = _toy([0.0])
  for label in (0, 1):
    res = idpdb.node_bound(net, net, label, FAST)
    assert res.upper <= TOL


def test_infeasible_when_no_member_can_disagree():
  """A member that always predicts class 0 on [0,1]^2 cannot disagree with class 0: -inf."""
  net, _ = _toy([0.0])
  hid = net.layers[0]
  always0 = Network((hid, AffineLayer.point(np.eye(2), np.array([5.0, 0.0]))), (2,), "logits")
  res = idpdb.node_bound(net, always0, 0, FAST)
  assert res.upper == -math.inf and res.status == "INFEASIBLE"
  out = idpdb.lucid_compute(net, [always0, always0], 0, PLAIN, progress=False)
  assert out.beta == -math.inf and out.exact


def _three_class(seed):
  """A random 3-6-3 network N and five members with weights moved by N(0, 0.05^2) noise."""
  rng = np.random.default_rng(seed)
  w1, b1 = rng.normal(size=(6, 3)), rng.normal(size=6) * 0.3
  w2, b2 = rng.normal(size=(3, 6)), rng.normal(size=3) * 0.3
  net = Network((AffineLayer.point(w1, b1), AffineLayer.point(w2, b2)), (3,), "logits")
  members = [Network((AffineLayer.point(w1 + 0.05 * rng.normal(size=w1.shape), b1),
                      AffineLayer.point(w2 + 0.05 * rng.normal(size=w2.shape),
                                        b2 + 0.05 * rng.normal(size=3))), (3,), "logits")
             for _ in range(5)]
  return net, members


def test_three_classes_big_m():
  """Multi-class disagreement via big-M over alpha: BaB (exact mode) equals the naive maximum."""
  net, members = _three_class(seed=3)
  for label in range(3):
    nv = idpdb.naive_compute(net, members, label, PLAIN)
    bb = idpdb.lucid_compute(net, members, label, PLAIN, progress=False)
    md = idpdb.lucid_compute(net, members, label, FAST, progress=False)
    assert nv.exact and bb.exact
    assert abs(bb.beta - nv.beta) < 1e-4, (label, bb.beta, nv.beta)
    assert md.beta >= nv.beta - TOL
    _replay_sampled(net, idpdb.as_family(members), label, nv.beta, n=20000, seed=label)


# ------------------------------------------------------------------------------------------------
# Real leave-one-out families
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("label", [0, 1])
@pytest.mark.parametrize("md,ris", [(True, True), (False, False), (True, False)])
def test_bab_at_least_exact(real, label, md, ris):
  cfg = dataclasses.replace(FAST, matching=md, matching_pre=md, relax=ris)
  exact = real["naive"][label]
  assert exact.exact and exact.complete
  res = idpdb.lucid_compute(real["net"], real["fam"], label, cfg, progress=False)
  assert res.beta >= exact.beta - TOL, (res.beta, exact.beta)
  assert all(b >= res.beta - 1e-12 for _, b in res.anytime)
  assert res.lower <= exact.beta + TOL  # a confirmed leaking confidence never exceeds beta*
  if not ris:  # no relaxation, no time-out: BaB is exact (MD is implied)
    assert res.exact
    assert abs(res.beta - exact.beta) < 1e-4, (res.beta, exact.beta)


def test_root_hyper_network_over_approximates(real):
  """Spec §3 property 2: beta_{c,S} >= beta_{c,{i}} for every member of S."""
  net, fam = real["net"], real["fam"]
  for label in (0, 1):
    root = idpdb.node_bound(net, idpdb.hyper_of(fam, np.arange(fam.size)), label, FAST)
    assert root.upper >= np.max(real["naive"][label].per_member) - TOL
    half = idpdb.node_bound(net, idpdb.hyper_of(fam, np.arange(fam.size // 2)), label, PLAIN)
    assert half.upper >= np.max(real["naive"][label].per_member[: fam.size // 2]) - TOL


def test_incumbents_replay(real):
  """Every incumbent: C_N(x) >= incumbent - tol, incumbent <= bound; on a singleton without RiS
  the member disagrees at x, and on a hyper-network the rebuilt member from the trace does."""
  net, fam = real["net"], real["fam"]
  checked = 0
  for label in (0, 1):
    for rows in (np.arange(fam.size), np.arange(3), np.array([int(real["naive"][label].argmax)])):
      res = idpdb.node_bound(net, idpdb.hyper_of(fam, rows), label, PLAIN)
      assert res.x is not None and np.all((res.x >= 0) & (res.x <= 1))
      assert res.x_confidence >= res.incumbent - TOL
      assert res.incumbent <= res.upper + TOL
      assert res.witness_margin <= TOL
      outs = fam.select(rows).outputs(res.x[None])[:, 0, :]
      if rows.size == 1:
        assert idpdb.confidence(net, outs, label)[0] <= TOL
      checked += 1
  assert checked == 6


def _replay_sampled(net, fam, label, beta, n=20000, seed=0):
  xs = np.random.default_rng(seed).uniform(size=(n, net.input_size))
  c_n = idpdb.confidence(net, net_lib.forward_batch(net, xs), label)
  leaking = np.min(idpdb.confidence(net, fam.outputs(xs), label), axis=0) <= 0.0
  assert leaking.any()
  assert c_n[leaking].max() <= beta + TOL


@pytest.mark.parametrize("label", [0, 1])
def test_adversarial_search_never_beats_beta(real, label):
  """Issue item 6c: no disagreeing input found by PGD (or uniform sampling) exceeds beta."""
  net, fam = real["net"], real["fam"]
  beta = real["naive"][label].beta
  found = idpdb.attack(net, fam, label, starts=512, steps=300, key=label)
  best, x, member = found.confidence, found.x, found.member
  assert x is not None                  # the search finds leaking inputs ...
  assert best <= beta + TOL, (best, beta)  # ... none above the exact bound
  assert best >= 0.5 * beta             # and it is a real attack, not a vacuous one
  outs = fam.select([member]).outputs(x[None])[:, 0, :]
  assert idpdb.confidence(net, outs, label)[0] <= 0.0   # the member really disagrees at x
  assert abs(idpdb.confidence(net, net_lib.forward(net, x)[None], label)[0] - best) < 1e-12
  _replay_sampled(net, fam, label, beta, seed=10 + label)


def test_attack_on_a_member_subset_replays_against_the_whole_family(real):
  """``search_members``: the search sees a few members; the answer is confirmed on all of them."""
  net, fam = real["net"], real["fam"]
  for label in (0, 1):
    beta = real["naive"][label].beta
    found = idpdb.attack(net, fam, label, starts=256, steps=200, key=jax.random.PRNGKey(label),
                         search_members=2)
    best, x, member = found.confidence, found.x, found.member
    assert x is not None and 0 <= member < fam.size
    assert best <= beta + TOL
    outs = fam.select([member]).outputs(x[None])[:, 0, :]
    assert idpdb.confidence(net, outs, label)[0] <= 0.0
  with pytest.raises(ValueError, match="search_members"):
    idpdb.attack(net, fam, 0, starts=4, steps=2, search_members=0)


def test_time_limits_stay_sound(real):
  """Tiny per-node and total limits: the answer is still >= exact and flagged not exact."""
  net, fam = real["net"], real["fam"]
  for label in (0, 1):
    exact = real["naive"][label].beta
    node = dataclasses.replace(FAST, node_time_limit=1e-3)
    res = idpdb.lucid_compute(net, fam, label, node, progress=False)
    assert res.beta >= exact - TOL
    assert any(r.status != "OPTIMAL" for r in res.tree)  # the limit did cut solves short
    assert not res.exact
    tot = dataclasses.replace(PLAIN, total_time_limit=0.3)
    res = idpdb.lucid_compute(net, fam, label, tot, progress=False)
    assert res.beta >= exact - TOL and not res.exact
    assert res.timed_out
    one = idpdb.node_bound(net, idpdb.hyper_of(fam, np.arange(fam.size)), label, FAST,
                           time_limit=1e-3)
    assert one.upper >= exact - TOL and not one.optimal


def test_betas_from_flax_params(real):
  out = idpdb.betas(None, real["full"], real["stacked"], PLAIN, progress=False)
  assert set(out) == {0, 1}
  for c, r in out.items():
    assert abs(r.beta - real["naive"][c].beta) < 1e-4


def test_betas_of_a_real_conv_family_are_sound():
  """LUCID's CNN (`Conv1dNet`, LUCID §7): a leave-one-out family trained for real on 6
  breast_cancer features. Every member read through `from_flax` reproduces ``model.apply`` in
  float64 on 10^4 points and the box corners; ``betas(model, ...)`` is at least every member's
  exact beta (per-member MILPs) and every leaking confidence found by sampling and by PGD."""
  from sklearn.datasets import load_breast_cancer

  from boundjax import ensembles
  from boundjax.models import Conv1dNet
  X, y = load_breast_cancer(return_X_y=True)
  X = X[:, [0, 1, 2, 20, 21, 27]]
  X = (X - X.min(0)) / (X.max(0) - X.min(0))
  rows = np.random.default_rng(1).choice(len(X), 60, replace=False)
  X, y = X[rows].astype(np.float32), y[rows].astype(np.int32)
  d = X.shape[1]
  model = Conv1dNet(channels=3)
  init = model.init(jax.random.PRNGKey(1), jnp.zeros((1, d)))
  ens = ensembles.train_ensemble(model, init, ensembles.sgd(0.1, weight_decay=1e-5), X, y,
                                 ensembles.leave_k_out(np.arange(5)), epochs=30, batch_size=16,
                                 seed=1, progress=False)
  stacked = jax.tree_util.tree_map(lambda a: np.asarray(a)[1:], ens.params)
  net = net_lib.from_flax(model, ens.full, (d,), sparse_threshold=0.0)
  fam = idpdb.as_family(stacked, net.output, model=model, input_shape=(d,))
  assert fam.size == 5 and [w.shape[1:] for w in fam.ws] == [(12, 6), (6, 12), (2, 6), (2, 2)]
  rng = np.random.default_rng(2)
  corners = ((np.arange(2 ** d)[:, None] >> np.arange(d)) & 1).astype(np.float64)
  xs = np.concatenate([rng.uniform(size=(10_000, d)), corners])
  ref = np.stack([np.asarray(model.apply(jax.tree_util.tree_map(
      lambda a, i=i: np.asarray(a, np.float64)[i], stacked), xs)) for i in range(fam.size)])
  assert np.abs(fam.outputs(xs) - ref).max() < 1e-9
  with pytest.raises(ValueError, match="input_shape"):
    idpdb.betas(model, ens.full, stacked, PLAIN, progress=False)
  got = idpdb.betas(model, ens.full, stacked, PLAIN, progress=False, input_shape=(d,))
  leaking_seen = 0
  for c in (0, 1):
    exact = idpdb.naive_compute(net, fam, c, PLAIN)
    assert exact.exact and exact.complete
    assert got[c].beta >= exact.beta - TOL, (c, got[c].beta, exact.beta)
    c_n = idpdb.confidence(net, net_lib.forward_batch(net, xs), c)
    leaking = np.min(idpdb.confidence(net, fam.outputs(xs), c), axis=0) <= 0.0
    if leaking.any():
      leaking_seen += 1
      assert c_n[leaking].max() <= got[c].beta + TOL
    found = idpdb.attack(net, fam, c, starts=256, steps=200, key=jax.random.PRNGKey(c))
    if found.x is not None:
      assert found.confidence <= exact.beta + TOL <= got[c].beta + 2 * TOL
  assert leaking_seen >= 1   # the family does disagree somewhere: the checks above bite


# ------------------------------------------------------------------------------------------------
# Bound tightening (IdpDbConfig.tighten)
# ------------------------------------------------------------------------------------------------

def _pre_acts(ws, bs, xs):
  """Pre-activations of every layer for a batch of members ``ws[m]: (K, o, i)`` at ``xs``."""
  h = np.broadcast_to(xs, (ws[0].shape[0],) + xs.shape)
  out = []
  for m, (w, b) in enumerate(zip(ws, bs)):
    z = np.einsum("koi,kni->kno", w, h) + b[:, None, :]
    out.append(z)
    h = np.maximum(z, 0.0)
  return out


def _inside(vals, lo, hi, tol=1e-9):
  return bool(np.all(vals >= lo - tol) and np.all(vals <= hi + tol))


def _synthetic(seed=5, d=6, width=16, members=6, noise=0.03):
  rng = np.random.default_rng(seed)
  shapes = [(width, d), (width, width), (2, width)]
  ws = [rng.normal(size=s) / np.sqrt(s[1]) * 1.5 for s in shapes]
  bs = [rng.normal(size=s[0]) * 0.3 for s in shapes]
  net = Network(tuple(AffineLayer.point(w, b) for w, b in zip(ws, bs)), (d,), "logits")
  fam = Family([np.stack([w + noise * rng.normal(size=w.shape) for _ in range(members)]) for w in ws],
               [np.stack([b + noise * rng.normal(size=b.shape) for _ in range(members)]) for b in bs],
               "logits")
  return net, fam


def _box_samples(d, n, seed):
  rng = np.random.default_rng(seed)
  xs = rng.uniform(size=(n, d))
  xs[: n // 4] = rng.integers(0, 2, size=(n // 4, d))   # vertices of the box
  return xs


def _check_tightening(net, fam, cfg, n=4000, seed=0):
  d = net.input_size
  lo, hi = np.zeros(d), np.ones(d)
  ref0 = bounds_lib.compute(net, lo, hi, cfg.bounds)
  ref = idpdb.tighten_net(net, lo, hi, cfg)
  hyper = idpdb.hyper_of(fam, np.arange(fam.size))
  diff0 = difference_bounds(net, hyper, lo, hi, cfg.bounds)
  diff = idpdb.tighten_hyper(net, hyper, lo, hi, ref, cfg)
  for new, old in ((ref, ref0), (diff.hyper, diff0.hyper), (diff.pre, diff0.pre),
                   (diff.post, diff0.post)):
    for (L, U), (L0, U0) in zip(new, old):   # never looser
      assert np.all(L >= L0) and np.all(U <= U0) and np.all(L <= U)
  xs = _box_samples(d, n, seed)
  nw = [np.asarray(l.w_lower)[None] for l in net.layers]
  nb = [np.asarray(l.b_lower)[None] for l in net.layers]
  z_net = [z[0] for z in _pre_acts(nw, nb, xs)]
  for z, (L, U) in zip(z_net, ref):
    assert _inside(z, L, U)
  # real members and random parameters anywhere in the hyper-network's box (endpoints included)
  rng = np.random.default_rng(seed + 1)
  k = 8
  pick = lambda lo_, hi_: lo_ + rng.uniform(size=(k,) + lo_.shape) * (hi_ - lo_)
  hw = [pick(np.asarray(l.w_lower), np.asarray(l.w_upper)) for l in hyper.layers]
  hbias = [pick(l.b_lower, l.b_upper) for l in hyper.layers]
  hw[0][:2] = np.where(rng.uniform(size=hw[0][:2].shape) < 0.5, hyper.layers[0].w_lower,
                       hyper.layers[0].w_upper)
  for ws, bs in ((fam.ws, fam.bs), (hw, hbias)):
    zs = _pre_acts(ws, bs, xs)
    for m, (z, (L, U), (dl, du)) in enumerate(zip(zs, diff.hyper, diff.pre)):
      assert _inside(z, L, U), m
      assert _inside(z - z_net[m][None], dl, du), m
      if m < len(zs) - 1:
        pl, pu = diff.post[m]
        assert _inside(np.maximum(z, 0) - np.maximum(z_net[m][None], 0), pl, pu), m
  return ref0, ref, diff0, diff


def test_tightening_sound_and_tighter():
  """LP tightening: contains N's and the box's pre-activations at thousands of inputs, never
  looser than IBP; the LP bounds enclose the exact per-neuron optimum (tighten="milp")."""
  net, fam = _synthetic()
  cfg = dataclasses.replace(FAST, tighten="lp")
  ref0, ref, diff0, diff = _check_tightening(net, fam, cfg)
  width = lambda bs: sum(float(np.sum(U - L)) for L, U in bs[1:])
  assert width(ref) < 0.9 * width(ref0)              # it does tighten (else the test is vacuous)
  assert width(diff.hyper) < 0.9 * width(diff0.hyper)
  mcfg = dataclasses.replace(FAST, tighten="milp", tighten_time_limit=60.0)
  exact = idpdb.tighten_net(net, np.zeros(net.input_size), np.ones(net.input_size), mcfg)
  for (L, U), (Le, Ue) in zip(ref, exact):           # LP relaxation >= exact MILP optimum
    assert np.all(L <= Le + 1e-7) and np.all(U >= Ue - 1e-7)
  assert width(exact) < width(ref)
  # the exact optimum is a sound bound too, and nearly attained by sampled inputs
  xs = _box_samples(net.input_size, 20000, 7)
  z1 = _pre_acts([np.asarray(l.w_lower)[None] for l in net.layers],
                 [np.asarray(l.b_lower)[None] for l in net.layers], xs)[1][0]
  assert np.all(z1.max(0) <= exact[1][1] + 1e-7) and np.all(z1.min(0) >= exact[1][0] - 1e-7)


def test_tightening_lp_net_encloses_samples():
  """tighten="lp-net": N's bounds are the "lp" ones, N# keeps interval arithmetic over them;
  sampled inputs, real members and random box parameters stay inside."""
  net, fam = _synthetic()
  _, ref, _, diff = _check_tightening(net, fam, dataclasses.replace(FAST, tighten="lp-net"))
  lp = idpdb.tighten_net(net, np.zeros(net.input_size), np.ones(net.input_size),
                         dataclasses.replace(FAST, tighten="lp"))
  for (L, U), (Ll, Ul) in zip(ref, lp):
    np.testing.assert_array_equal(L, Ll), np.testing.assert_array_equal(U, Ul)
  plain = difference_bounds(net, idpdb.hyper_of(fam, np.arange(fam.size)),
                                  np.zeros(net.input_size), np.ones(net.input_size), ref_bounds=ref)
  for (a, b), (c, d) in zip(diff.pre, plain.pre):
    np.testing.assert_array_equal(a, c), np.testing.assert_array_equal(b, d)


@pytest.mark.slow
def test_tightening_milp_mode_encloses_samples_and_bounds_lp():
  """tighten="milp" on N and N# (exact per-neuron optima): sampled members stay inside, and the
  LP bounds enclose them."""
  net, fam = _synthetic()
  _, ref, _, diff = _check_tightening(net, fam, dataclasses.replace(FAST, tighten="lp"))
  mcfg = dataclasses.replace(FAST, tighten="milp", tighten_time_limit=120.0)
  _, exact, _, dexact = _check_tightening(net, fam, mcfg, n=2000, seed=3)
  for new, lp in ((exact, ref), (dexact.hyper, diff.hyper)):
    for (L, U), (Le, Ue) in zip(lp, new):
      assert np.all(L <= Le + 1e-7) and np.all(U >= Ue - 1e-7)


def test_tightening_real_family(real):
  """Same checks on the breast_cancer leave-one-out family."""
  _check_tightening(real["net"], real["fam"], dataclasses.replace(FAST, tighten="lp"))


@pytest.mark.parametrize("label", [0, 1])
def test_tightened_beta_sound_and_not_worse(real, label):
  """beta with tighten="lp" is >= the exact per-member beta* and <= beta without tightening."""
  exact = real["naive"][label]
  tight = dataclasses.replace(FAST, tighten="lp")
  res_t = idpdb.lucid_compute(real["net"], real["fam"], label, tight, progress=False)
  res_0 = idpdb.lucid_compute(real["net"], real["fam"], label, FAST, progress=False)
  assert res_t.beta >= exact.beta - TOL, (res_t.beta, exact.beta)
  assert res_t.beta <= res_0.beta + 1e-4, (res_t.beta, res_0.beta)
  assert res_t.tree[0].milp_bound <= res_0.tree[0].milp_bound + 1e-4
  assert res_t.n_unstable_net <= res_0.n_unstable_net
  assert res_t.tree[0].tighten_seconds > 0 and res_0.tree[0].tighten_seconds == 0
  nv = idpdb.naive_compute(real["net"], real["fam"], label, tight)   # exact with tight bounds too
  assert nv.exact and abs(nv.beta - exact.beta) < 1e-4


# ------------------------------------------------------------------------------------------------
# Screening by per-member difference bounds
# ------------------------------------------------------------------------------------------------

SCREEN = dataclasses.replace(PLAIN, screen=True)


@pytest.mark.parametrize("output", ["logits", "sign"])
def test_screen_bound_is_exact_on_the_toy(output):
  """Member i moves one logit by b_i, so its difference interval is exactly [b_i, b_i]: u_i = b_i
  (capped by N's largest confidence, 1 on [0, 1]^2), and the screened search is exact."""
  net, members = _toy(FIG3_BIASES, output)
  top, bottom = (0, 1) if output == "logits" else (1, 0)
  b = np.array(FIG3_BIASES)
  np.testing.assert_allclose(idpdb.member_bounds(net, members, top), np.minimum(b, 1.0), atol=1e-8)
  np.testing.assert_allclose(idpdb.member_bounds(net, members, bottom), np.minimum(-b, 1.0),
                             atol=1e-8)
  res = idpdb.lucid_compute(net, members, top, SCREEN, progress=False)
  assert res.exact and abs(res.beta - b.max()) < TOL
  assert res.tree[0].status == "SCREENED" and res.tree[0].members.size == len(members)
  assert res.n_milps == 1   # only the member of largest screening bound needed its MILP


@pytest.mark.parametrize("label", [0, 1])
def test_member_bounds_enclose_every_member(real, label):
  """u_i >= the exact per-member beta* (per-point MILPs) and >= every sampled leaking confidence
  of that member; with N's bounds tightened by LP the screening is sound and no looser."""
  net, fam = real["net"], real["fam"]
  exact = real["naive"][label].per_member
  u = idpdb.member_bounds(net, fam, label)
  u_lp = idpdb.member_bounds(net, fam, label, dataclasses.replace(PLAIN, tighten="lp-net"))
  assert np.all(u >= exact - TOL), np.min(u - exact)
  assert np.all(u_lp >= exact - TOL) and np.all(u_lp <= u + 1e-9)
  assert np.all(u < 10 * np.max(np.abs(exact)) + 1)   # not vacuous
  xs = np.random.default_rng(label).uniform(size=(20000, net.input_size))
  c_n = idpdb.confidence(net, net_lib.forward_batch(net, xs), label)
  c_m = idpdb.confidence(net, fam.outputs(xs), label)            # (K, n)
  hits = 0
  for i in range(fam.size):
    leak = c_m[i] <= 0.0
    if leak.any():
      assert c_n[leak].max() <= u[i] + TOL
      hits += 1
  assert hits >= fam.size // 2


def test_three_class_member_bounds_enclose_exact():
  net, members = _three_class(seed=4)
  for label in range(3):
    nv = idpdb.naive_compute(net, members, label, PLAIN)
    assert nv.exact
    u = idpdb.member_bounds(net, members, label)
    assert np.all(u >= nv.per_member - TOL), (label, u, nv.per_member)
    res = idpdb.lucid_compute(net, members, label, SCREEN, progress=False)
    assert res.exact and abs(res.beta - nv.beta) < 1e-4


@pytest.mark.parametrize("label", [0, 1])
def test_screened_bab_sound_and_exact(real, label):
  """The screened search without relaxation or time-out is exact; with MD/RiS it stays >= exact;
  the anytime bound never increases and starts at the largest screening bound."""
  exact = real["naive"][label]
  res = idpdb.lucid_compute(real["net"], real["fam"], label, SCREEN, progress=False)
  assert res.exact and abs(res.beta - exact.beta) < 1e-4, (res.beta, exact.beta)
  assert res.anytime[0][1] == pytest.approx(float(res.member_bounds.max()))
  bounds = [b for _, b in res.anytime]
  assert all(a >= b - 1e-12 for a, b in zip(bounds, bounds[1:]))
  solved = [r for r in res.tree if r.solved]
  assert all(r.members.size == 1 for r in solved) and len(solved) == res.n_milps
  assert res.screen_summary()["members"] == real["fam"].size
  for cfg in (dataclasses.replace(FAST, screen=True),
              dataclasses.replace(FAST, screen=True, workers=2, tighten="lp-net")):
    out = idpdb.lucid_compute(real["net"], real["fam"], label, cfg, progress=False)
    assert out.beta >= exact.beta - TOL
    assert out.lower <= exact.beta + TOL


def test_screened_bab_time_limits_stay_sound(real):
  net, fam = real["net"], real["fam"]
  for label in (0, 1):
    exact = real["naive"][label].beta
    for cfg in (dataclasses.replace(SCREEN, total_time_limit=0.05),
                dataclasses.replace(SCREEN, node_time_limit=1e-3)):
      res = idpdb.lucid_compute(net, fam, label, cfg, progress=False)
      assert res.beta >= exact - TOL and not res.exact
      assert res.beta <= float(res.member_bounds.max()) + 1e-12


@pytest.mark.parametrize("screen", [True, False])
def test_retried_singletons_reach_the_exact_beta(real, screen):
  """Tiny node limits with ``retry_singletons``: a timed-out singleton on top is solved again with
  twice the time until it finishes, so the search still ends exact."""
  cfg = dataclasses.replace(PLAIN, screen=screen, node_time_limit=0.01, retry_singletons=True)
  for label in (0, 1):
    exact = real["naive"][label].beta
    res = idpdb.lucid_compute(real["net"], real["fam"], label, cfg, progress=False)
    assert res.exact and abs(res.beta - exact) < 1e-4, (label, res.beta, exact)
    solved = [int(r.members[0]) for r in res.tree
              if r.members.size == 1 and r.solved]
    assert len(solved) > len(set(solved))   # some member's MILP was run again


# ------------------------------------------------------------------------------------------------
# Branching helpers and errors
# ------------------------------------------------------------------------------------------------

def test_elbow_and_partition():
  assert idpdb.elbow_k([2, 4, 8], [100.0, 20.0, 15.0]) == 4
  assert idpdb.elbow_k([2, 4, 8], [100.0, 60.0, 50.0]) == 4
  assert idpdb.elbow_k([2, 4, 8], [100.0, 30.0, 29.0]) == 4
  assert idpdb.elbow_k([2, 4, 8], [5.0, 5.0, 5.0]) == 2
  assert idpdb.elbow_k([2], [1.0]) == 2
  rng = np.random.default_rng(0)
  centres = rng.normal(size=(4, 10)) * 10
  feats = np.concatenate([c + rng.normal(size=(6, 10)) * 0.1 for c in centres])
  rows = np.arange(24)
  parts = idpdb.partition(feats, rows, idpdb.IdpDbConfig())
  assert sorted(np.concatenate(parts).tolist()) == rows.tolist()
  assert len(parts) == 4 and all(p.size == 6 for p in parts)
  capped = idpdb.partition(feats, rows, idpdb.IdpDbConfig(max_k=2))
  assert len(capped) == 2 and sorted(np.concatenate(capped).tolist()) == rows.tolist()
  raised = idpdb.partition(feats, rows, idpdb.IdpDbConfig(max_k=2, workers=3))
  assert len(raised) == 3
  same = idpdb.partition(np.zeros((5, 3)), np.arange(5), idpdb.IdpDbConfig())
  assert len(same) >= 2 and sorted(np.concatenate(same).tolist()) == list(range(5))
  assert [p.tolist() for p in idpdb.partition(feats, np.array([3, 7]), idpdb.IdpDbConfig())] == [[3], [7]]


def test_errors():
  net, members = _toy(FIG3_BIASES)
  wide = Network((AffineLayer.point(np.ones((3, 2)), np.zeros(3)),
                  AffineLayer.point(np.ones((2, 3)), np.zeros(2))), (2,), "logits")
  with pytest.raises(ValueError, match="mismatched architectures"):
    idpdb.node_bound(net, wide, 0)
  with pytest.raises(ValueError, match="mismatched architectures"):
    idpdb.lucid_compute(net, [wide], 0, progress=False)
  with pytest.raises(ValueError, match="mismatched architectures"):
    idpdb.member_bounds(net, [wide], 0)
  with pytest.raises(ValueError, match="out of range"):
    idpdb.member_bounds(net, members, 2)
  with pytest.raises(ValueError, match="no members"):
    idpdb.member_bounds(net, [], 0)
  with pytest.raises(ValueError, match="lower"):
    idpdb.member_bounds(net, members, 0, input_lower=1.0, input_upper=0.0)
  with pytest.raises(ValueError, match="layer shapes"):
    idpdb.as_family([members[0], wide])
  with pytest.raises(ValueError, match="tighten must be"):
    idpdb.IdpDbConfig(tighten="crown")
  with pytest.raises(ValueError, match="tighten_time_limit"):
    idpdb.IdpDbConfig(tighten="lp", tighten_time_limit=0.0)
  for bad in (2, -1):
    with pytest.raises(ValueError, match="out of range"):
      idpdb.node_bound(net, members[0], bad)
    with pytest.raises(ValueError, match="out of range"):
      idpdb.naive_compute(net, members, bad)
  hyper = idpdb.hyper_of(idpdb.as_family(members), np.arange(4))
  interval_first = Network((AffineLayer(np.eye(2) * 0.9, np.eye(2) * 1.1, np.zeros(2), np.zeros(2)),
                            hyper.layers[1]), (2,), "logits")
  with pytest.raises(ValueError, match="non-negative"):
    idpdb.node_bound(net, interval_first, 0, input_lower=-1.0)
  sign_net, _ = _toy([0.0], "sign")
  with pytest.raises(ValueError):
    idpdb.node_bound(net, sign_net, 0)
  with pytest.raises(ValueError, match="tau"):
    idpdb.IdpDbConfig(tau=-1)
  with pytest.raises(ValueError, match="executor"):
    idpdb.IdpDbConfig(executor="threads")
  with pytest.raises(ValueError, match="kmeans_ks"):
    idpdb.IdpDbConfig(kmeans_ks=(1, 2))
  with pytest.raises(ValueError, match="max_k"):
    idpdb.IdpDbConfig(max_k=1)


# ------------------------------------------------------------------------------------------------
# Heavier variants
# ------------------------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("solver,executor", [("scip", "serial"), ("highs", "process")])
def test_larger_family_solvers_and_pool(solver, executor):
  full, stacked, _ = _breast_cancer(n_points=120, n_members=30, hidden=(10, 10), seed=1)
  net = net_lib.from_params(full)
  fam = family_from_stacked(stacked)
  cfg = dataclasses.replace(FAST, solver=solver, workers=2 if executor == "process" else 1,
                            executor=executor)
  for label in (0, 1):
    exact = idpdb.naive_compute(net, fam, label, dataclasses.replace(PLAIN, solver=solver))
    res = idpdb.lucid_compute(net, fam, label, cfg, progress=False)
    assert res.beta >= exact.beta - TOL
    plain = idpdb.lucid_compute(net, fam, label, dataclasses.replace(cfg, relax=False),
                                progress=False)
    assert plain.exact and abs(plain.beta - exact.beta) < 1e-4
    found = idpdb.attack(net, fam, label, starts=2048, steps=500, key=100 + label)
    assert found.found and found.confidence <= exact.beta + TOL
