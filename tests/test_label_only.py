"""LUCID's guarded label-only predictor and its baselines (boundjax.privacy), with β from
milp.idpdb.

Soundness: on a real leave-one-out family (every network of D minus one point, breast_cancer with
three features), with β from a sound MILP method, every label the guard returns without noise is
the label of every member; and no input where a member disagrees with N has confidence above β.
"""

from __future__ import annotations

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from boundjax import ensembles as E
from boundjax.models import MLP
from boundjax.privacy import label_only as L
from milp import idpdb
from milp.idpdb import compute_betas, per_member_betas

jax.config.update("jax_platforms", "cpu")


# ---------------------------------------------------------------------------------------------
# Exponential mechanism
# ---------------------------------------------------------------------------------------------

def _draws(u, eps, n, seed=0):
  keys = jax.random.split(jax.random.PRNGKey(seed), n)
  u = jnp.broadcast_to(jnp.asarray(u, jnp.float32), (n, len(u)))
  return np.asarray(jax.vmap(L.exponential_mechanism, in_axes=(0, 0, None))(keys, u, eps))


@pytest.mark.parametrize("eps,u", [(2.0, [0.0, 0.5, 1.0, 0.2]), (1.0, [0.0, 1.0]),
                                   (0.2, [1.0, 0.0, 0.0])])
def test_exponential_mechanism_matches_exact_distribution(eps, u):
  n = 20000
  counts = np.bincount(_draws(u, eps, n), minlength=len(u))
  p = L.exponential_probabilities(u, eps)
  assert stats.chisquare(counts, n * p).pvalue > 1e-3


def test_exponential_mechanism_epsilon_zero_is_uniform_and_large_is_argmax():
  counts = np.bincount(_draws([0.0, 1.0, 0.0, 0.0, 0.0], 0.0, 20000, seed=1), minlength=5)
  assert stats.chisquare(counts).pvalue > 1e-3
  assert np.all(_draws([0.0, 0.0, 1.0], 1e4, 500, seed=2) == 2)


def test_keep_probability_reproduces_the_paper_values_and_lemma_3_2():
  for eps, want in [(0.0, 0.5), (0.02, 0.50250), (0.2, 0.52498), (1.0, 0.62246)]:
    assert L.keep_probability(eps, 2) == pytest.approx(want, abs=1e-5)
  k, eps = 4, 0.7
  for a in range(k):
    for b in range(k):
      pa = L.exponential_probabilities(np.eye(k)[a], eps)
      pb = L.exponential_probabilities(np.eye(k)[b], eps)
      assert np.all(pa / pb <= math.exp(eps) + 1e-12)


def test_exponential_mechanism_is_jittable_and_validates():
  f = jax.jit(L.exponential_mechanism)
  assert int(f(jax.random.PRNGKey(0), jnp.array([0.0, 1.0]), 1e4)) == 1
  with pytest.raises(ValueError, match="epsilon"):
    L.exponential_mechanism(jax.random.PRNGKey(0), jnp.array([0.0, 1.0]), -1.0)
  with pytest.raises(ValueError, match="sensitivity"):
    L.exponential_mechanism(jax.random.PRNGKey(0), jnp.array([0.0, 1.0]), 1.0, 0.0)
  with pytest.raises(ValueError, match="NaN"):
    L.exponential_mechanism(jax.random.PRNGKey(0), jnp.array([0.0, np.nan]), 1.0)


# ---------------------------------------------------------------------------------------------
# The guard on hand-made networks
# ---------------------------------------------------------------------------------------------

def identity_apply(params, x):      # logits = x + bias: the confidence is readable by hand
  return x + params["b"]


ID_PARAMS = {"b": jnp.zeros(3)}


def test_strict_threshold_and_no_randomness_above_it():
  g = L.LabelOnlyGuard(identity_apply, ID_PARAMS, [0.25, 0.25, 0.25], 0.0,
                       key=jax.random.PRNGKey(0),
                       input_shape=(3,))
  above = g.query_batch(np.array([[0.75, 0.49, 0.0], [0.0, 1.0, 0.5]], np.float32))
  assert above.labels.tolist() == [0, 1] and not above.noised.any()
  assert g._draws == 0 and not g.memo                     # no RNG consumed, nothing memoised
  at = g.query_batch(np.array([[0.75, 0.5, 0.0]], np.float32))   # confidence exactly 0.25
  assert at.confidence[0] == np.float32(0.25) and at.noised[0]
  assert len(g.memo) == 1


def test_noised_answers_follow_the_mechanism_over_fresh_inputs():
  eps = 1.0
  g = L.LabelOnlyGuard(identity_apply, ID_PARAMS, [10.0, 10.0, 10.0], eps,
                       key=jax.random.PRNGKey(3),
                       input_shape=(3,))
  rng = np.random.default_rng(0)
  x = rng.uniform(0, 0.2, (6000, 3)).astype(np.float32)
  x[:, 2] += 1.0                                          # N predicts class 2 everywhere
  ans = g.query_batch(x)
  assert ans.noised.all()
  counts = np.bincount(ans.labels, minlength=3)
  p = L.exponential_probabilities(np.eye(3)[2], eps)
  assert stats.chisquare(counts, len(x) * p).pvalue > 1e-3
  assert g.noised_answers == len(x) and g.epsilon_spent == pytest.approx(len(x) * eps)


def test_memo_repeats_answers_and_evicts_the_oldest():
  g = L.LabelOnlyGuard(identity_apply, ID_PARAMS, [np.inf] * 3, 0.0, key=jax.random.PRNGKey(1),
                       memo_size=3,
                       input_shape=(3,))
  x = np.array([0.1, 0.2, 0.3], np.float32)
  first = g.query(x)
  assert all(g.query(x) == first for _ in range(30))
  assert g.query_batch(np.stack([x] * 5)).labels.tolist() == [first] * 5
  assert g.noised_answers == 1
  # -0.0 and 0.0 are the same query (no second noise draw to average)
  z = np.array([-0.0, 0.5, 0.5], np.float32)
  g.query(z)
  g.query(np.abs(z))
  assert g.noised_answers == 2
  # capacity 3: the fourth distinct input evicts the oldest (x)
  others = [np.array([0.9, 0.1, v], np.float32) for v in (0.1, 0.2)]
  for o in others:
    g.query(o)
  keys = list(g.memo)
  assert len(keys) == 3 and x.tobytes() not in keys
  assert keys[0] == np.abs(z).astype(np.float32).tobytes()
  assert keys[1:] == [o.tobytes() for o in others]
  # fresh noise after eviction: over many evict/re-query rounds x gets both labels
  seen = set()
  for r in range(40):
    for v in range(3):
      g.query(np.array([0.5, 0.5, 10.0 + r + v / 10], np.float32))
    seen.add(g.query(x))
  assert len(seen) > 1


def test_batch_equals_single_queries_with_duplicates():
  model = MLP(hidden=(8,), out=3)
  params = model.init(jax.random.PRNGKey(0), jnp.zeros((1, 4)))
  x = np.random.default_rng(1).uniform(size=(60, 4)).astype(np.float32)
  x = np.concatenate([x, x[:10]])                          # repeated rows share the memo
  conf = np.asarray(L.predict_with_confidence(model.apply(params, x)).confidence)
  betas = [float(np.median(conf))] * 3
  a = L.LabelOnlyGuard(model.apply, params, betas, 0.5, key=jax.random.PRNGKey(7)).query_batch(x)
  single = L.LabelOnlyGuard(model.apply, params, betas, 0.5, key=jax.random.PRNGKey(7))
  got = [single.query(row) for row in x]
  assert a.labels.tolist() == got
  assert a.labels[60:].tolist() == a.labels[:10].tolist()
  assert 0 < a.noised.sum() < len(x)


def test_noised_mask_is_exactly_confidence_at_most_beta():
  model = MLP(hidden=(16, 16), out=3)
  params = model.init(jax.random.PRNGKey(2), jnp.zeros((1, 5)))
  x = np.random.default_rng(2).uniform(size=(500, 5)).astype(np.float32)
  z = np.asarray(model.apply(params, x), np.float32)
  pred = z.argmax(1)
  srt = np.sort(z, 1)
  conf = srt[:, -1] - srt[:, -2]
  betas = np.array([np.quantile(conf, q) for q in (0.2, 0.5, 0.8)], np.float32)
  betas[1] = conf[pred == 1][0]                            # one input exactly at its β
  ans = L.LabelOnlyGuard(model.apply, params, betas, 1.0, key=jax.random.PRNGKey(0)).query_batch(x)
  assert np.array_equal(ans.noised, conf <= betas[pred])
  assert np.allclose(ans.confidence, conf, atol=1e-6)
  keep = ~ans.noised
  assert np.array_equal(ans.labels[keep], pred[keep])


def test_sign_network_convention():
  apply = lambda p, x: x[:, :1] - p                         # z = x_0 - p
  g = L.LabelOnlyGuard(apply, 0.5, {"0": 0.1, "1": 0.2}, 0.0, key=jax.random.PRNGKey(0),
                       input_shape=(2,))
  assert g.output == "sign" and g.n_classes == 2
  ans = g.query_batch(np.array([[0.9, 0], [0.0, 0], [0.65, 0], [0.5, 0]], np.float32))
  assert ans.labels[:2].tolist() == [1, 0] and not ans.noised[:2].any()
  assert np.allclose(ans.confidence, [0.4, 0.5, 0.15, 0.0], atol=1e-6)
  assert ans.noised[2:].all()                               # 0.15 <= β1; a tie z = 0 is class 1
  pred = L.predict_with_confidence(jnp.array([[0.0], [-0.3]]), "sign")
  assert pred.label.tolist() == [1, 0] and np.allclose(pred.confidence, [0.0, 0.3])
  jitted = jax.jit(L.predict_with_confidence, static_argnums=1)(jnp.array([[0.2], [-0.3]]), "sign")
  assert jitted.label.tolist() == [1, 0] and np.allclose(jitted.confidence, [0.2, 0.3])


def test_bad_inputs_raise():
  mk = lambda **kw: L.LabelOnlyGuard(identity_apply, ID_PARAMS, kw.pop("betas", [0.1] * 3),
                                     kw.pop("eps", 0.5), input_shape=(3,), **kw)
  g = mk()
  with pytest.raises(ValueError, match="shape"):
    g.query_batch(np.zeros((2, 4)))
  with pytest.raises(ValueError, match="shape"):
    g.query(np.zeros(2))
  with pytest.raises(ValueError, match="NaN"):
    g.query(np.array([0.1, np.nan, 0.2]))
  with pytest.raises(ValueError, match="one β per class"):
    mk(betas=[0.1, 0.2])
  with pytest.raises(ValueError, match="finite or \\+inf"):
    mk(betas=[0.1, np.nan, 0.2])
  with pytest.raises(ValueError, match="finite or \\+inf"):
    mk(betas=[0.1, -np.inf, 0.2])
  with pytest.raises(ValueError, match="missing"):
    mk(betas={0: 0.1, 1: 0.1})
  with pytest.raises(ValueError, match="epsilon"):
    mk(eps=-0.1)
  with pytest.raises(ValueError, match="memo_size"):
    mk(memo_size=0)
  with pytest.raises(ValueError, match="PRNG key"):
    mk(key=3)
  with pytest.raises(ValueError, match="input shape"):
    L.LabelOnlyGuard(identity_apply, ID_PARAMS, [0.1] * 3, 0.5)


# ---------------------------------------------------------------------------------------------
# Soundness on a real leave-one-out family
# ---------------------------------------------------------------------------------------------

N_PER_CLASS, FEATURES = 15, (7, 20, 21)   # mean concave points, worst radius, worst texture
N_CHECKED = 8                              # members also bounded one by one (per_member_betas)


@pytest.fixture(scope="module")
def family():
  """N and all |D| = 30 leave-one-out networks of a 3-6-6-2 MLP on a balanced breast_cancer
  subset (SGD lr 0.5, batch 8, 60 epochs: test accuracy ~0.94, members that visibly disagree),
  with β from `milp.idpdb` (LUCID's branch-and-bound), per-member MILP bounds for the first
  members (an independent encoding), and probe inputs."""
  return _make_family(N_PER_CLASS, seed=0)


def _make_family(per_class: int, seed: int):
  from boundjax.data import load_sklearn
  ds = load_sklearn("breast_cancer")
  rng = np.random.default_rng(seed)
  idx = np.sort(np.concatenate([rng.choice(np.flatnonzero(ds.y_train == c), per_class,
                                           replace=False) for c in (0, 1)]))
  cols = list(FEATURES)
  x, y = ds.x_train[idx][:, cols], ds.y_train[idx]
  model = MLP(hidden=(6, 6), out=2)
  init = model.init(jax.random.PRNGKey(0), x[:1])
  ens = E.train_ensemble(model, init, E.sgd(0.5, weight_decay=1e-5), x, y,
                         E.leave_k_out(np.arange(len(idx))), epochs=60, batch_size=8, seed=0,
                         progress=False)
  members = ens.select(np.arange(1, len(idx) + 1)).params
  info = compute_betas(ens.full, members, method="idpdb", node_time_limit=20.0)
  betas = info.betas
  sub = jax.tree_util.tree_map(lambda a: a[:N_CHECKED], members)
  res = per_member_betas(ens.full, sub, cfg=idpdb.IdpDbConfig(node_time_limit=20.0))
  probe = _probe_inputs(model, ens.full, ds.x_test[:, cols])
  member_labels = np.asarray(jax.vmap(model.apply, in_axes=(0, None))(members, probe)).argmax(-1)
  return dict(model=model, params=ens.full, members=members, betas=betas, info=info, res=res,
              sub=sub, probe=probe, member_labels=member_labels)


def _probe_inputs(model, params, x_test, n_random=3000, seed=0):
  """Test inputs, uniform points and points near N's decision boundary (bisection + jitter)."""
  d = x_test.shape[1]
  rng = np.random.default_rng(seed)
  u = rng.uniform(size=(n_random, d)).astype(np.float32)
  lab = np.asarray(model.apply(params, u)).argmax(1)
  a, b = u[lab == 0][:300], u[lab == 1][:300]
  m = min(len(a), len(b))
  a, b = a[:m], b[:m]
  lo, hi = np.zeros((m, 1), np.float32), np.ones((m, 1), np.float32)
  for _ in range(30):
    mid = (lo + hi) / 2
    go = np.asarray(model.apply(params, a + mid * (b - a))).argmax(1) == 0
    lo, hi = np.where(go[:, None], mid, lo), np.where(go[:, None], hi, mid)
  jitter = rng.normal(scale=0.05, size=(4, m, d)).astype(np.float32)
  near = np.clip((a + lo * (b - a))[None] + jitter, 0, 1).reshape(-1, d)
  return np.concatenate([x_test, u, near]).astype(np.float32)


def test_unnoised_labels_are_every_members_label(family):
  _check_guard_soundness(family)


@pytest.mark.slow
@pytest.mark.parametrize("per_class,seed", [(30, 1), (45, 2)])
def test_unnoised_labels_are_every_members_label_larger_families(per_class, seed):
  _check_guard_soundness(_make_family(per_class, seed))


def _check_guard_soundness(family):
  model, params, members, betas = (family[k] for k in ("model", "params", "members", "betas"))
  x, member_labels = family["probe"], family["member_labels"]
  # β need not be exact (LUCID's relax-if-similar may leave it above β*, still sound):
  # what is checked below is the guard's soundness, against every member's label
  assert all(np.isfinite(b) and b > 0 for b in family["info"].betas.values())
  ans = L.LabelOnlyGuard(model.apply, params, betas, 0.0, key=jax.random.PRNGKey(0)).query_batch(x)
  disagree = np.any(member_labels != ans.labels[None], axis=0) & ~ans.noised
  assert not disagree.any(), f"{int(disagree.sum())} un-noised answers some member disagrees with"
  # LUCID's guard: no disagreeing input has confidence above β of N's class
  z = np.asarray(model.apply(params, x))
  pred = z.argmax(1)
  conf = np.abs(z[:, 1] - z[:, 0])
  leak = np.any(member_labels != pred[None], axis=0)
  assert leak.sum() > 20                                   # the probe reaches the leaking region
  b = np.array([betas[0], betas[1]])
  assert np.all(conf[leak] <= b[pred[leak]])
  # the check has teeth: β at half the worst sampled leaking confidence lets leaks through
  worst = np.array([conf[leak & (pred == c)].max(initial=0.0) for c in (0, 1)])
  weak = L.LabelOnlyGuard(model.apply, params, np.maximum(worst / 2, 1e-6), 0.0,
                          key=jax.random.PRNGKey(0)).query_batch(x)
  assert np.any(np.any(member_labels != weak.labels[None], axis=0) & ~weak.noised)
  # Naive-iDP noises exactly the leaking inputs; the guard noises a superset (property 12)
  naive = L.naive_idp(jax.random.PRNGKey(0), model.apply, params, members, x, 0.0)
  labels, noised = naive.labels, naive.noised
  assert np.array_equal(noised, leak) and np.all(ans.noised[noised])
  assert np.array_equal(labels[~noised], pred[~noised])


def test_per_member_bounds_hold_per_member_and_agree_with_idpdb(family):
  """Each member's MILP value bounds N's confidence wherever that member disagrees (sampled), is
  within a factor 2 of a sampled leaking confidence, and the per-member β of the first members
  equals LUCID's branch-and-bound over the same members (one MILP per member, without matching
  dependencies or relaxation, against the search over hyper-networks with both)."""
  model, params, res = family["model"], family["params"], family["res"]
  table = res.per_member
  assert res.proven and table.shape == (N_CHECKED, 2)
  z = np.asarray(model.apply(params, family["probe"]))
  conf = z[:, 1] - z[:, 0]
  conf_c = np.stack([-conf, conf], 1)                      # C^c_N for c = 0, 1
  for c in (0, 1):
    seen = []
    for i, ml in enumerate(family["member_labels"][:N_CHECKED]):
      hit = ml != c
      if hit.any():
        assert conf_c[hit, c].max() <= table[i, c] + 1e-4, (i, c)
        seen.append(conf_c[hit, c].max())
    assert max(seen) >= 0.5 * table[:, c].max() > 0
  info = compute_betas(params, family["sub"], method="idpdb", node_time_limit=20.0)
  for c in (0, 1):
    assert info.raw[c] == pytest.approx(table[:, c].max(), rel=1e-3, abs=1e-4)
    assert res.betas[c] == pytest.approx(L.guard_beta(table[:, c].max()))
  screened = compute_betas(params, family["sub"], method="idpdb", node_time_limit=20.0,
                           screen=True)
  for c in (0, 1):
    assert screened.raw[c] >= table[:, c].max() - 1e-4
    assert screened.betas[c] >= info.betas[c] - 1e-3
  per = compute_betas(params, family["sub"], method="per_member", node_time_limit=20.0)
  assert per.method == "per_member" and per.all_exact and per.betas == res.betas
  assert L.guard_beta(-np.inf) == 0.0 and L.guard_beta(np.nan) == np.inf


# ---------------------------------------------------------------------------------------------
# Baselines
# ---------------------------------------------------------------------------------------------

def test_naive_noise_keeps_the_label_with_the_right_probability():
  model = MLP(hidden=(4,), out=2)
  params = model.init(jax.random.PRNGKey(0), jnp.zeros((1, 2)))
  x = np.random.default_rng(0).uniform(size=(8000, 2)).astype(np.float32)
  pred = np.asarray(model.apply(params, x)).argmax(1)
  lab = L.naive_noise(jax.random.PRNGKey(1), model.apply, params, x, 1.0)
  kept = int(np.sum(lab == pred))
  assert stats.binomtest(kept, len(x), L.keep_probability(1.0, 2)).pvalue > 1e-3


def _flip_probability_mc(eps: float, n: int = 400_000, seed: int = 0) -> tuple[float, float]:
  """P(MAP label != true label) for ALIBI's two-class release, by brute force with numpy alone:
  o = e_y + Laplace(2/eps) noise, MAP = the class whose one-hot is nearest in L1 (uniform prior,
  the definition of the posterior), ties counted half. Returns (estimate, its standard error)."""
  rng = np.random.default_rng(seed)
  o = np.array([1.0, 0.0]) + rng.laplace(scale=2.0 / eps, size=(n, 2))  # true class 0
  d0, d1 = np.abs(o - [1, 0]).sum(1), np.abs(o - [0, 1]).sum(1)
  p = float(np.mean(d1 < d0) + 0.5 * np.mean(d1 == d0))
  return p, math.sqrt(p * (1 - p) / n)


def test_alibi_noise_flip_probability_and_posterior_ratio():
  eps, n = 1.0, 40000
  y = np.random.default_rng(0).integers(0, 2, n)
  o = L.alibi_noisy_labels(jax.random.PRNGKey(0), y, 2, eps)
  noise = (o - np.eye(2)[y]).reshape(-1)
  assert stats.kstest(noise, stats.laplace(scale=2 / eps).cdf).pvalue > 1e-3
  post = L.alibi_posterior(o, eps)
  g = np.abs(o) - np.abs(o - 1)
  tie = g[:, 0] == g[:, 1]
  flips = np.sum((np.argmax(post, 1) != y) & ~tie) + 0.5 * np.sum(tie)
  p = L.alibi_label_flip_probability(eps)
  for e in (eps, 0.3, 8.0):  # the quadrature against brute force over the definition
    p_mc, se = _flip_probability_mc(e)
    assert abs(L.alibi_label_flip_probability(e) - p_mc) < 5 * se + 1e-6, e
  assert abs(flips / n - p) < 4 * math.sqrt(p * (1 - p) / n)
  # ε-label-DP of the release: likelihood ratios of any o under two labels are within e^ε
  assert np.all(np.abs(np.log(post[:, 0] / post[:, 1])) <= eps + 1e-9)


def test_train_alibi_and_accuracy_table_end_to_end():
  from boundjax.data import load_sklearn
  ds = load_sklearn("breast_cancer")
  x, y = ds.x_train[:, :4], ds.y_train
  model = MLP(hidden=(8,), out=2)
  init = model.init(jax.random.PRNGKey(0), x[:1])
  params = E.train_single(model, init, E.sgd(0.5), x, y, epochs=20, batch_size=32)
  alibi = L.train_alibi(model.apply, init, x, y, 8.0, epochs=20, batch_size=32, lr=0.5,
                        iterations=2)
  # The posterior recovers the true label except where the noise flips it: at eps = 8 the flip
  # rate is p ~ 0.027 (brute force, numpy), so ~97% agreement; allow twice p. ALIBI with the
  # noise of eps = 1 (p ~ 0.38) would give ~0.75 here.
  p8, _ = _flip_probability_mc(8.0)
  assert alibi.guarantee == "eps-label-DP" and alibi.posterior_label_agreement > 1 - 2 * p8
  xt, yt = ds.x_test[:, :4], ds.y_test
  # A label-noise-free twin: the same soft-label trainer on the true labels, same batch order
  # (train_alibi's key split), so the only difference is ALIBI's label noise.
  _, k_train = jax.random.split(jax.random.PRNGKey(0))
  twin = L.train_soft_labels(model.apply, init, x, np.eye(2)[y], epochs=20, batch_size=32,
                             lr=0.5, key=k_train)
  acc_of = lambda p: float(np.mean(np.asarray(model.apply(p, xt)).argmax(1) == yt))
  majority = max(float(np.mean(yt)), 1 - float(np.mean(yt)))   # 0.632
  acc_twin, acc_alibi = acc_of(twin), acc_of(alibi.params)
  assert acc_twin > majority + 0.15, (acc_twin, majority)      # the comparison means something
  assert abs(acc_alibi - acc_twin) <= 0.05, (acc_alibi, acc_twin)
  conf = np.asarray(L.predict_with_confidence(model.apply(params, xt)).confidence)
  betas = [float(np.quantile(conf, 0.1))] * 2
  out = L.accuracy_table(model.apply, params, betas, xt, yt, idp_epsilons=(0.0, 1.0),
                         dp_epsilons=(8.0,), trained={"ALIBI": {8.0: (model.apply, alibi.params)}},
                         repeats=3, latency_queries=20)
  rows = {(r.mechanism, r.epsilon): r for r in out.rows}
  assert set(rows) == {("LUCID", 0.0), ("LUCID", 1.0), ("Naive-Noise", 0.0),
                       ("Naive-Noise", 1.0), ("ALIBI", 8.0)}
  for e in (0.0, 1.0):
    r = rows[("LUCID", e)]
    assert 0.05 < r.noised_fraction < 0.2
    assert abs(r.accuracy - r.expected_accuracy) < 0.05
    assert rows[("Naive-Noise", e)].expected_accuracy < r.expected_accuracy
  assert rows[("ALIBI", 8.0)].accuracy == pytest.approx(acc_alibi, abs=1e-9)
  assert rows[("ALIBI", 8.0)].accuracy > majority + 0.15
  assert out.row("ALIBI", 8.0) is rows[("ALIBI", 8.0)]
  lat = out.latency
  assert lat.queries == 20 and lat.median_ms <= lat.max_ms and lat.mean_ms <= lat.max_ms
  text = L.format_table(out)
  assert "LUCID" in text
  again = L.AccuracyTable.from_dict(json.loads(json.dumps(out.as_dict())))
  assert again == out and L.format_table(again) == text == L.format_table(out.as_dict())


def test_guard_latency_is_per_query_in_milliseconds(monkeypatch):
  """A guard whose query takes >= 3 ms must be reported as 3-60 ms per query (not seconds, not
  the total, not including the two warm-up queries)."""
  import time as _time
  model = MLP(hidden=(4,), out=2)
  params = model.init(jax.random.PRNGKey(0), jnp.zeros((1, 2)))
  guard = L.LabelOnlyGuard(model.apply, params, [0.1, 0.1], 0.0, key=jax.random.PRNGKey(0))
  calls = []

  def slow_query(self, row):
    calls.append(self is guard)
    _time.sleep(0.003)

  monkeypatch.setattr(L.LabelOnlyGuard, "query", slow_query)
  lat = L.guard_latency(guard, np.zeros((10, 2), np.float32), 7)
  assert lat.queries == 7 and calls.count(True) == 7 and len(calls) == 9
  assert 3.0 <= lat.median_ms <= lat.max_ms and 3.0 <= lat.mean_ms < 60.0, lat


def test_dpsgd_baseline_reaches_its_epsilon():
  x = np.random.default_rng(0).uniform(size=(256, 3)).astype(np.float32)
  y = (x[:, 0] > 0.5).astype(np.int32)
  model = MLP(hidden=(4,), out=2)
  init = model.init(jax.random.PRNGKey(0), x[:1])
  res = L.train_dpsgd_baseline(model.apply, init, x, y, 1.0, epochs=1, batch_size=64)
  assert res.epsilon <= 1.0 + 1e-6 and res.noise_multiplier > 0
  assert res.delta == pytest.approx(1 / 256) and "params" not in res.info()


def test_calling_the_guard_on_a_batch_says_what_was_passed_and_what_to_call():
  g = L.LabelOnlyGuard(identity_apply, ID_PARAMS, [0.25, 0.25, 0.25], 0.0,
                       key=jax.random.PRNGKey(0), input_shape=(3,))
  batch = np.array([[0.75, 0.49, 0.0], [0.0, 1.0, 0.5]], np.float32)
  for call in (g, g.query):
    with pytest.raises(ValueError) as info:
      call(batch)
    msg = str(info.value)
    assert "got an array of shape (2, 3), a batch of 2 inputs" in msg
    assert "answer one input of shape (3,)" in msg and "call guard.query_batch(x)" in msg
  with pytest.raises(ValueError, match=r"got an array of shape \(4,\)\.$"):
    g(np.zeros(4, np.float32))
  assert g(batch[0]) == 0 and g.query_batch(batch).labels.tolist() == [0, 1]


def test_tune_alibi_draws_the_labels_once_and_chooses_on_the_noisy_validation_split(monkeypatch):
  from boundjax.data import load_sklearn
  from boundjax.privacy import baselines as B
  ds = load_sklearn("breast_cancer")
  x, y = ds.x_train[:, :4], ds.y_train
  model = MLP(hidden=(8,), out=2)
  init = model.init(jax.random.PRNGKey(0), x[:1])
  calls = []
  real = B.alibi_noisy_labels
  monkeypatch.setattr(B, "alibi_noisy_labels", lambda *a, **k: calls.append(1) or real(*a, **k))
  # a learning rate of 1e-6 cannot leave the initial model; 0.5 learns the task
  grid = [{"lr": 1e-6, "iterations": 1}, {"lr": 0.5, "iterations": 1}]
  final, rows = B.tune_alibi(model.apply, init, x, y, 8.0, grid, epochs=20, batch_size=32,
                             key=jax.random.PRNGKey(3))
  assert len(calls) == 1                                  # one release of the noisy labels
  assert [r["lr"] for r in rows] == [1e-6, 0.5] and [r["chosen"] for r in rows] == [False, True]
  assert rows[1]["val_agreement"] > rows[0]["val_agreement"] + 0.1
  assert final.guarantee == "eps-label-DP" and final.iterations == 1
  xt, yt = ds.x_test[:, :4], ds.y_test
  acc = float(np.mean(np.asarray(model.apply(final.params, xt)).argmax(1) == yt))
  assert acc > max(np.mean(yt), 1 - np.mean(yt)) + 0.15
  # the chosen model is the chosen point retrained on every point with the same release
  _, _, k_train = jax.random.split(jax.random.PRNGKey(3), 3)
  noisy = real(jax.random.split(jax.random.PRNGKey(3), 3)[0], y, 2, 8.0)
  again = L.train_alibi(model.apply, init, x, y, 8.0, epochs=20, batch_size=32, lr=0.5,
                        iterations=1, key=k_train, noisy=noisy)
  for a, b in zip(jax.tree_util.tree_leaves(again.params), jax.tree_util.tree_leaves(final.params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  # ties go to the earlier grid point; bad input is refused
  _, rows = B.tune_alibi(model.apply, init, x, y, 8.0, [grid[1], grid[1]], epochs=2,
                         batch_size=32)
  assert [r["chosen"] for r in rows] == [True, False]
  with pytest.raises(ValueError, match="grid is empty"):
    B.tune_alibi(model.apply, init, x, y, 8.0, [])
  with pytest.raises(ValueError, match="val_fraction"):
    B.tune_alibi(model.apply, init, x, y, 8.0, grid, val_fraction=1.0)
  with pytest.raises(ValueError, match="noisy labels have shape"):
    L.train_alibi(model.apply, init, x, y, 8.0, noisy=np.zeros((3, 2)))
