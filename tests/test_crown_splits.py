"""Split constraints in the engine (`bj.crown(..., splits=True, beta=True)`): bounds over
``{x in box : s_j z_j(x) >= 0}`` (β-CROWN, Wang et al. 2021, §3.1).

Soundness: points sampled in each sub-problem's box and kept when they satisfy its splits
(rejection sampling; at least 10^4 feasible points over the sub-problems) lie within the bounds,
float64 evaluation, tol 0 in sound mode. Tightness only where it is guaranteed: with every ReLU
split the network is linear on the feasible polytope, so the β-optimised bound tends to the LP
minimum (strong duality) and never exceeds it (scipy's linprog). Against a textbook CROWN with
split clipping in NumPy float64 (`_crown_reference`): at least as tight.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import boundjax as bj


@pytest.fixture(autouse=True)
def x64():
  with jax.enable_x64(True):
    yield


def _net(seed: int, sizes=(3, 12, 12, 4)):
  rng = np.random.default_rng(seed)
  ws = [rng.normal(size=(o, i)) / np.sqrt(i) for i, o in zip(sizes[:-1], sizes[1:])]
  bs = [0.3 * rng.normal(size=o) for o in sizes[1:]]
  return ws, bs


def _apply(ws, bs):
  def f(x):  # x: (batch, n0)
    h = x
    for k, (w, b) in enumerate(zip(ws, bs)):
      h = h @ jnp.asarray(w).T + jnp.asarray(b)
      if k < len(ws) - 1:
        h = jax.nn.relu(h)
    return h
  return f


def _pre_np(ws, bs, x):
  """Pre-activations of every hidden layer and the outputs, float64 NumPy."""
  zs, h = [], x
  for k, (w, b) in enumerate(zip(ws, bs)):
    z = h @ w.T + b
    if k < len(ws) - 1:
      zs.append(z)
      h = np.maximum(z, 0.0)
  return zs, z


def _subproblems(ws, bs, B: int, seed: int, n_split: int):
  """``B`` sub-boxes of [-1, 1]^n0 with splits on ``n_split`` neurons per hidden layer, signed
  as at a random point of the box (so the sub-problem is feasible) except the last two
  sub-problems, whose signs are random (possibly infeasible)."""
  rng = np.random.default_rng(seed)
  n0 = ws[0].shape[1]
  centre = rng.uniform(-0.6, 0.6, (B, n0))
  rad = rng.uniform(0.2, 0.5, (B, n0))
  lo, hi = centre - rad, centre + rad
  x0 = rng.uniform(lo, hi)
  zs, _ = _pre_np(ws, bs, x0)
  splits = []
  for z in zs:
    s = np.zeros(z.shape, np.int8)
    for i in range(B):
      j = rng.choice(z.shape[1], n_split, replace=False)
      s[i, j] = np.where(z[i, j] >= 0, 1, -1)
      if i >= B - 2:
        s[i, j] = rng.choice([-1, 1], n_split)
    splits.append(s)
  return lo, hi, splits


def _feasible_samples(ws, bs, lo, hi, splits, n: int, seed: int):
  """Per sub-problem: points of its box (uniform plus corners) satisfying its splits."""
  rng = np.random.default_rng(seed)
  out = []
  for i in range(lo.shape[0]):
    x = rng.uniform(lo[i], hi[i], (n, lo.shape[1]))
    corners = np.array(np.meshgrid(*[[a, b] for a, b in zip(lo[i], hi[i])],
                                   indexing="ij")).reshape(lo.shape[1], -1).T
    x = np.concatenate([x, corners])
    zs, y = _pre_np(ws, bs, x)
    ok = np.ones(len(x), bool)
    for z, s in zip(zs, splits):
      ok &= np.all((s[i] * z >= 0) | (s[i] == 0), axis=1)
    out.append((x[ok], y[ok]))
  return out


def _check(out, samples, C, d, tol, what):
  lo_b, hi_b = np.asarray(out.lower), np.asarray(out.upper)
  assert not np.any(np.isnan(lo_b)) and not np.any(np.isnan(hi_b)), what
  total = 0
  for i, (_, y) in enumerate(samples):
    v = y @ C.T - d
    total += len(v)
    assert np.all(v >= lo_b[i] - tol), (what, i, (v - lo_b[i]).min())
    assert np.all(v <= hi_b[i] + tol), (what, i, (hi_b[i] - v).min())
  return total


@pytest.mark.parametrize("seed", [0, 1])
def test_split_bounds_are_sound_on_sampled_feasible_points(seed):
  ws, bs = _net(seed)
  f = _apply(ws, bs)
  B = 6
  lo, hi, splits = _subproblems(ws, bs, B, seed, n_split=3)
  rng = np.random.default_rng(seed + 10)
  C = rng.normal(size=(3, 4))
  d = rng.normal(size=3)
  samples = _feasible_samples(ws, bs, lo, hi, splits, 10_000, seed)
  box = bj.Interval(jnp.asarray(lo), jnp.asarray(hi))
  feasible = sum(len(x) for x, _ in samples)
  assert feasible >= 10_000
  g = lambda x: f(x) @ jnp.asarray(C).T - jnp.asarray(d)  # noqa: E731
  runs = {
      "crown": bj.crown(f, spec=C, splits=True, return_info=True),
      "beta": bj.crown(f, spec=C, splits=True, beta=True, alpha_steps=30, return_info=True),
      "beta-ibp": bj.crown(f, spec=C, splits=True, beta=True, intermediate="ibp",
                           return_info=True),
  }
  outs = {}
  for name, fn in runs.items():
    out, info = fn(box, splits=splits)
    out = bj.Interval(out.lower - d, out.upper - d, validate=False)
    outs[name] = out
    assert _check(out, samples, C, d, 1e-9, name) == feasible
    inf = np.asarray(info.infeasible)
    for i in range(B):
      if inf[i]:  # declared empty: no sampled point may satisfy the splits
        assert len(samples[i][0]) == 0, (name, i)
  # sound mode (the specification composed into the function): tol 0 against float64
  for name, kw in (("sound-crown", {}), ("sound-beta", {"beta": True, "alpha_steps": 30})):
    out, _ = bj.crown(g, sound=True, splits=True, return_info=True, **kw)(box, splits=splits)
    assert _check(out, samples, C, d, 0.0, name) == feasible
  # β never loosens CROWN's bound with the same splits
  assert np.all(np.asarray(outs["beta"].lower) >= np.asarray(outs["crown"].lower) - 1e-9)


def test_infeasible_splits_give_empty_bounds_without_nan():
  ws, bs = _net(3, (2, 6, 3))
  f = _apply(ws, bs)
  # neuron 0 of the layer: z = w x + b; demand z >= 0 on a box where z < 0 everywhere
  lo = np.full((1, 2), -1.0)
  hi = np.full((1, 2), 1.0)
  w, b = ws[0][0], bs[0][0]
  zmax = np.abs(w).sum() + b
  bs2 = [bs[0].copy(), bs[1]]
  bs2[0][0] = -zmax - 1.0  # now z_0 <= -1 on the box
  f2 = _apply(ws, bs2)
  s = np.zeros((1, 6), np.int8)
  s[0, 0] = 1
  out, info = bj.crown(f2, splits=True, beta=True, return_info=True)(
      bj.Interval(jnp.asarray(lo), jnp.asarray(hi)), splits=[s])
  assert bool(np.asarray(info.infeasible)[0])
  assert np.all(np.asarray(out.lower) == np.inf) and not np.any(np.isnan(np.asarray(out.upper)))
  del f


def _lp_min(ws, bs, c, lo, hi, pattern):
  """``min c·f(x)`` over ``{x in [lo, hi] : the activation pattern holds}`` by linprog (the
  network is affine there: ``z_k = A_k x + a_k``)."""
  from scipy.optimize import linprog
  n0 = lo.shape[0]
  A, a = np.eye(n0), np.zeros(n0)
  rows, rhs = [], []
  for k, (w, b) in enumerate(zip(ws, bs)):
    Az, az = w @ A, w @ a + b
    if k == len(ws) - 1:
      obj, const = c @ Az, c @ az
      break
    s = pattern[k]
    for j in range(len(s)):  # s z >= 0  <=>  -s (A x + a) <= 0
      rows.append(-s[j] * Az[j])
      rhs.append(s[j] * az[j])
    act = (s > 0).astype(float)
    A, a = act[:, None] * Az, act * az
  res = linprog(obj, A_ub=np.array(rows), b_ub=np.array(rhs), bounds=list(zip(lo, hi)),
                method="highs")
  assert res.status in (0, 2)
  return None if res.status == 2 else res.fun + const


def _fully_split(seed: int):
  """A 2-5-5-1 network, a box, every neuron split as at a random point of it (feasible), and
  the LP minimum of the output there: ``(f, lo, hi, pattern, lp)``."""
  ws, bs = _net(seed + 20, (2, 5, 5, 1))
  rng = np.random.default_rng(seed)
  lo = rng.uniform(-1, -0.2, 2)
  hi = lo + rng.uniform(0.5, 1.2, 2)
  x0 = rng.uniform(lo, hi, (1, 2))
  zs, _ = _pre_np(ws, bs, x0)
  pattern = [np.where(z[0] >= 0, 1, -1).astype(np.int8) for z in zs]
  return _apply(ws, bs), lo, hi, pattern, _lp_min(ws, bs, np.ones(1), lo, hi, pattern)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fully_split_network_reaches_the_lp_minimum(seed):
  """Every neuron split: the ReLUs are exact, so the bound is the Lagrangian dual of an LP;
  it never exceeds the LP minimum, and the optimised β reach it (strong duality)."""
  f, lo, hi, pattern, lp = _fully_split(seed)
  assert lp is not None
  box = bj.Interval(jnp.asarray(lo[None]), jnp.asarray(hi[None]))
  sp = [p[None] for p in pattern]
  crown_lb = float(bj.crown(f, splits=True)(box, splits=sp).lower[0, 0])
  beta_lb = float(bj.crown(f, splits=True, beta=True, alpha_steps=400, alpha_lr=0.05)(
      box, splits=sp).lower[0, 0])
  sound_lb = float(bj.crown(f, splits=True, beta=True, alpha_steps=400, alpha_lr=0.05,
                            sound=True)(box, splits=sp).lower[0, 0])
  assert crown_lb <= lp + 1e-9 and beta_lb <= lp + 1e-9 and sound_lb <= lp
  assert beta_lb >= crown_lb - 1e-9
  assert beta_lb >= lp - 1e-3 * (1 + abs(lp)), (crown_lb, beta_lb, lp)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_split_neurons_are_exact_in_sound_mode_whatever_their_warm_slopes(seed):
  """A split neuron's clipped bound is exactly 0 (``l <- max(l, 0)``, ``u <- min(u, 0)``) and
  ``t = x - 0`` needs no rounding, so in sound mode too its ReLU is linear and its slope α does
  not enter the bound. Every neuron split, β = 0 and one step (the warm start is the only
  iterate): the sound bound with warm α all 0 or all 1 equals float CROWN's to rounding, and
  stays below the LP minimum. (Rounding the clipped 0 outward made every split neuron
  unstable: relaxed by its warm α, the bound fell below CROWN's.)"""
  f, lo, hi, pattern, lp = _fully_split(seed)
  box = bj.Interval(jnp.asarray(lo[None]), jnp.asarray(hi[None]))
  sp = [p[None] for p in pattern]
  crown_lb = float(bj.crown(f, splits=True)(box, splits=sp).lower[0, 0])
  bound = bj.crown(f, splits=True, beta=True, alpha_steps=1, sound=True, return_info=True)
  _, info = bound(box, splits=sp)
  zero_beta = [np.zeros_like(np.asarray(b)) for b in info.beta]
  for a in (0.0, 1.0):
    alpha = [np.full_like(np.asarray(x), a) for x in info.alpha]
    out, _ = bound(box, splits=sp, warm=(alpha, zero_beta))
    lb = float(out.lower[0, 0])
    assert abs(lb - crown_lb) <= 1e-9 * (1 + abs(crown_lb)), (a, lb, crown_lb)
    assert lb <= lp, (a, lb, lp)


def _crown_reference(ws, bs, C, lo, hi, splits):
  """Lower bounds of ``C f(x)`` per sub-problem by textbook CROWN (Zhang et al. 2018, §3: one
  backward pass per layer from ``[I; -I]``, adaptive lower slopes ``1[u > -l]``), the split
  neurons' bounds clipped (``+1``: ``l <- max(l, 0)``, ``-1``: ``u <- min(u, 0)``), NumPy
  float64; ``+inf`` for an infeasible sub-problem. The reference the engine must match."""
  out = []
  for i in range(len(lo)):
    lbs, ubs = [], []

    def back(a, k):  # lower bounds of a z_k, z_k = W_{k-1} h_{k-1} + b_{k-1}
      const = np.zeros(len(a))
      for j in range(k, 0, -1):
        const = const + a @ bs[j - 1]
        a = a @ ws[j - 1]
        if j == 1:
          break
        l, u = lbs[j - 2], ubs[j - 2]
        unstable = (l < 0) & (u > 0)
        s = np.where(unstable, u / np.where(unstable, u - l, 1.0), (l >= 0).astype(float))
        low = np.where(l >= 0, 1.0, np.where(unstable, (u > -l).astype(float), 0.0))
        pos, neg = np.maximum(a, 0), np.minimum(a, 0)
        const = const + neg @ np.where(unstable, -s * l, 0.0)
        a = pos * low + neg * s
      return const + np.maximum(a, 0) @ lo[i] + np.minimum(a, 0) @ hi[i]

    empty = False
    for k in range(1, len(ws)):
      n = ws[k - 1].shape[0]
      b = back(np.vstack([np.eye(n), -np.eye(n)]), k)
      sp = np.asarray(splits[k - 1])[i]
      l, u = np.where(sp > 0, np.maximum(b[:n], 0), b[:n]), np.where(sp < 0,
                                                                    np.minimum(-b[n:], 0), -b[n:])
      empty = empty or bool(np.any(l > u))
      lbs.append(l)
      ubs.append(np.maximum(u, l))
    out.append(np.full(len(C), np.inf) if empty else back(np.asarray(C), len(ws)))
  return np.array(out)


def test_at_least_as_tight_as_textbook_crown():
  """The engine's CROWN bounds of sub-problems (boxes and splits) are at least as tight as
  `_crown_reference`'s (the same relaxations, met with interval bounds; float order may differ
  by ~1e-12), in float and in sound mode, and find the same infeasible sub-problems."""
  ws, bs = _net(5, (3, 16, 16, 16, 4))
  f = _apply(ws, bs)
  B = 8
  lo, hi, splits = _subproblems(ws, bs, B, 5, n_split=4)
  C = np.random.default_rng(7).normal(size=(3, 4))
  box = bj.Interval(jnp.asarray(lo), jnp.asarray(hi))
  ref = _crown_reference([np.asarray(w) for w in ws], [np.asarray(b) for b in bs], C, lo, hi,
                         splits)
  for sound in (False, True):
    if sound:
      g = lambda x: f(x) @ jnp.asarray(C).T  # noqa: E731
      out = bj.crown(g, sound=True, splits=True)(box, splits=splits)
    else:
      out = bj.crown(f, spec=C, splits=True)(box, splits=splits)
    mine = np.asarray(out.lower)
    fin = np.isfinite(ref)
    assert np.array_equal(fin, np.isfinite(mine))  # the same infeasible sub-problems
    assert np.all(mine[fin] >= ref[fin] - 1e-6 * (1 + np.abs(ref[fin]))), (sound, mine - ref)


def test_known_bounds_and_warm_start_and_coefficients():
  ws, bs = _net(8)
  f = _apply(ws, bs)
  B = 5
  lo, hi, splits = _subproblems(ws, bs, B, 8, n_split=2)
  C = np.random.default_rng(9).normal(size=(2, 4))
  box = bj.Interval(jnp.asarray(lo), jnp.asarray(hi))
  # root bounds (no splits) reused as known bounds with interval propagation (fast mode)
  _, root = bj.crown(f, spec=C, splits=True, return_info=True)(box)
  ibp_only, _ = bj.crown(f, spec=C, splits=True, intermediate="ibp", return_info=True)(
      box, splits=splits)
  fast, info = bj.crown(f, spec=C, splits=True, beta=True, intermediate="ibp",
                        return_info=True)(box, splits=splits, pre=root.pre)
  samples = _feasible_samples(ws, bs, lo, hi, splits, 4000, 8)
  _check(fast, samples, C, np.zeros(2), 1e-9, "known bounds")
  assert np.all(np.asarray(fast.lower) >= np.asarray(ibp_only.lower) - 1e-9)
  ok = ~np.asarray(info.infeasible)  # (an empty box is kept well defined as [l, max(u, l)])
  for (l, u), (l0, u0), s in zip(info.pre, root.pre, splits):  # met and clipped
    l, u, l0, u0, s = (np.asarray(a)[ok] for a in (l, u, l0, u0, s))
    assert np.all(l >= np.asarray(l0) - 1e-12) and np.all(u <= np.asarray(u0) + 1e-12)
    assert np.all(l[s > 0] >= 0) and np.all(u[s < 0] <= 0)
  # a warm start from the optimised parameters is never looser than their bound
  warm, info2 = bj.crown(f, spec=C, splits=True, beta=True, intermediate="ibp",
                         return_info=True, alpha_steps=5)(
      box, splits=splits, pre=root.pre, warm=(info.alpha, info.beta))
  assert np.all(np.asarray(warm.lower) >= np.asarray(fast.lower) - 1e-9)
  _check(warm, samples, C, np.zeros(2), 1e-9, "warm start")
  # the input coefficients: the bound's minimising corner evaluates above the bound
  lam = np.asarray(info2.input_coeffs[0])  # (B, k, n0)
  assert lam.shape == (B, 2, 3) and info2.relu_coeffs[0].shape == (B, 2, 12)
  corners = np.where(lam > 0, lo[:, None, :], hi[:, None, :])
  _, y = _pre_np(ws, bs, corners.reshape(-1, 3))
  vals = np.einsum("bkm,km->bk", y.reshape(B, 2, 4), C)
  inf = np.asarray(info2.infeasible)
  assert np.all(vals[~inf] >= np.asarray(warm.lower)[~inf] - 1e-9)


def test_bad_split_arguments_are_refused():
  ws, bs = _net(0, (2, 4, 1))
  f = bj.crown(_apply(ws, bs), splits=True)
  box = bj.Interval(jnp.zeros((1, 2)), jnp.ones((1, 2)))
  with pytest.raises(ValueError, match="one entry per ReLU node"):
    f(box, splits=[np.zeros((1, 4)), np.zeros((1, 4))])
  with pytest.raises(ValueError, match="shape"):
    f(box, splits=[np.zeros((1, 3))])
  with pytest.raises(ValueError, match="-1, 0 or"):
    f(box, splits=[np.full((1, 4), 2)])


def test_unstable_rows_only_skip_stable_neurons_and_stay_sound(monkeypatch):
  """Back-substitution from the unstable neurons only (``unstable_rows``): with the measured
  share ("auto") the output bounds and the unstable neurons' boxes equal those of every row;
  with too few rows (1/64) they may loosen but stay sound (tol 0 in sound mode, float64 samples)."""
  from boundjax.domains.linear import api
  ws, bs = _net(3, sizes=(3, 48, 48, 4))
  f = _apply(ws, bs)
  lo, hi, splits = _subproblems(ws, bs, 6, 3, n_split=4)
  mid, rad = (lo + hi) / 2, (hi - lo) / 2
  lo, hi = mid - 0.02 * rad, mid + 0.02 * rad  # small boxes: most neurons stable
  splits = [np.zeros_like(s) for s in splits]
  box = bj.Interval(jnp.asarray(lo), jnp.asarray(hi))
  shares = []
  real = api._rounded_share
  monkeypatch.setattr(api, "_rounded_share", lambda s: shares.append(float(s)) or real(s))
  full, info_full = bj.crown(f, splits=True, return_info=True, unstable_rows=1.0)(box)
  auto, info_auto = bj.crown(f, splits=True, return_info=True)(box)
  assert shares and 0 < shares[0] <= 0.5, shares  # the screening ran and found few unstable
  np.testing.assert_allclose(auto.lower, full.lower, rtol=0, atol=1e-9)
  np.testing.assert_allclose(auto.upper, full.upper, rtol=0, atol=1e-9)
  for (lf, uf), (la, ua) in zip(info_full.pre, info_auto.pre):
    lf, uf, la, ua = map(np.asarray, (lf, uf, la, ua))
    assert np.all(la <= lf + 1e-9) and np.all(ua >= uf - 1e-9)  # never tighter than CROWN's
    unstable = (lf < 0) & (uf > 0)
    np.testing.assert_allclose(la[unstable], lf[unstable], rtol=0, atol=1e-9)
    np.testing.assert_allclose(ua[unstable], uf[unstable], rtol=0, atol=1e-9)
  # sampled soundness (float64) for every choice of rows, known bounds from a parent included
  samples = _feasible_samples(ws, bs, lo, hi, splits, 2_000, 3)
  assert sum(len(x) for x, _ in samples) >= 10_000
  eye, zero = np.eye(4), np.zeros(4)
  parent = [(np.asarray(a), np.asarray(b)) for a, b in info_full.pre]
  for rows, known in (("auto", None), (1 / 64, parent)):  # 1/64: fewer rows than unstable
    out = bj.crown(f, sound=True, splits=True, unstable_rows=rows)(box, pre=known)
    _check(out, samples, eye, zero, 0.0, (rows, known is None))


@pytest.mark.parametrize("objective", ["lower", "both"])
def test_details_of_a_network_without_relu_nodes(objective):
  """``return_info`` on a network with no ReLU node (tanh only): no nodes, and the input
  coefficients have one row per output (the rows were once taken from the ReLU slopes alone,
  and a network without them crashed in a reshape to zero rows). The input coefficients are
  those of a sound lower bound: at 10^4 points plus the 8 corners of each box, ``y >= lower
  bound = Λ·x + const`` minimised over the box, i.e. every sample's output is at least the
  returned lower bound."""
  rng = np.random.default_rng(0)
  w, v = rng.normal(size=(3, 4)), rng.normal(size=(4, 2))
  f = lambda x: jnp.tanh(x @ jnp.asarray(w)) @ jnp.asarray(v)
  lo = rng.uniform(-1, 0, size=(2, 3))
  hi = lo + rng.uniform(0.1, 1, size=(2, 3))
  g = bj.crown(f, batch_axis=0, splits=True, beta=True, return_info=True, alpha_steps=3,
               alpha_objective=objective, sound=True)
  out, info = g(bj.Interval(jnp.asarray(lo), jnp.asarray(hi)))
  assert info.pre == () and info.relu_coeffs == ()
  assert [tuple(c.shape) for c in info.input_coeffs] == [(2, 2, 3)]
  assert np.all(np.isfinite(np.asarray(out.lower)))
  corners = np.array(np.meshgrid(*[[0, 1]] * 3, indexing="ij")).reshape(3, -1).T
  for b in range(2):
    xs = np.concatenate([rng.uniform(lo[b], hi[b], size=(10_000, 3)),
                         np.where(corners, hi[b], lo[b])])
    ys = np.tanh(xs @ w) @ v
    assert np.all(ys >= np.asarray(out.lower)[b] - 0.0)
    assert np.all(ys <= np.asarray(out.upper)[b] + 0.0)


@pytest.mark.parametrize("sound", [False, True])
def test_lower_only_passes_give_the_lower_bounds_of_both_sides_at_half_the_rows(sound):
  """``alpha_objective="lower_only"``: the output's passes carry the lower rows alone. Their
  lower bounds equal those of ``"lower"`` (which computes both sides; sound mode: never lower,
  its slack counts one side's terms), they hold on >= 10^4 sampled feasible points plus the
  corners of every sub-problem (tol 0 in sound mode), the upper bounds are the interval ones
  (never tighter than CROWN's),
  α/β come back with one side and are accepted back as a warm start with one side or two. A
  network with a relaxed nonlinearity (tanh) keeps both sides."""
  ws, bs = _net(3)
  f = _apply(ws, bs)
  B = 6
  lo, hi, splits = _subproblems(ws, bs, B, 3, n_split=3)
  C = np.random.default_rng(13).normal(size=(3, 4))
  g = lambda x: f(x) @ jnp.asarray(C).T  # noqa: E731
  box = bj.Interval(jnp.asarray(lo), jnp.asarray(hi))
  samples = _feasible_samples(ws, bs, lo, hi, splits, 10_000, 3)
  assert sum(len(x) for x, _ in samples) >= 10_000
  kw = dict(batch_axis=0, splits=True, beta=True, alpha_steps=20, return_info=True,
            sound=sound, intermediate="ibp")
  both, info2 = bj.crown(g, alpha_objective="lower", **kw)(box, splits=splits)
  one_fn = bj.crown(g, alpha_objective="lower_only", **kw)
  one, info1 = one_fn(box, splits=splits)
  assert [a.shape[1] for a in info1.alpha] == [1, 1] and [a.shape[1] for a in info2.alpha] == [2, 2]
  l1, l2 = np.asarray(one.lower), np.asarray(both.lower)
  finite = np.isfinite(l2)
  np.testing.assert_array_equal(np.isfinite(l1), finite)
  np.testing.assert_allclose(l1[finite], l2[finite], rtol=1e-9, atol=1e-9)
  if sound:
    assert np.all(l1[finite] >= l2[finite])
  up = np.asarray(one.upper)  # the forward interval pass's (splits applied), not CROWN's
  assert np.all(up[finite] >= np.asarray(both.upper)[finite] - 1e-9)
  assert _check(one, samples, C, np.zeros(3), 0.0 if sound else 1e-9, "lower_only") > 0
  for warm in ((info1.alpha, info1.beta), (info2.alpha, info2.beta)):
    again, _ = one_fn(box, splits=splits, warm=warm)
    assert np.all(np.asarray(again.lower)[finite] >= l1[finite] - 1e-6)
  t = lambda x: jnp.tanh(x @ jnp.asarray(ws[0]).T) @ jnp.asarray(ws[1][:, :12]).T  # noqa: E731
  _, info_t = bj.crown(lambda x: jax.nn.relu(t(x)), alpha_objective="lower_only",
                       **kw)(box, splits=[s[:, :12] for s in splits[1:]])
  assert [a.shape[1] for a in info_t.alpha] == [2]
