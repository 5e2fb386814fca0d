"""Barron constants (Barron): closed forms, FFT, Monte Carlo, invariances, and the
network upper bound checked against FFT estimates of random networks."""

import math
import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from boundjax import barron
from boundjax.auditing import adversary_apply
from boundjax.core import options

G = barron.CATALAN


def _sech2(mu):
  return lambda t: mu / jnp.cosh(mu * t) ** 2


# --- 1. closed forms ----------------------------------------------------------------------------

def test_tanh_mu_by_fft_batched_matches_abs_mu():
  mus = jnp.array([0.01, 0.1, 0.5, 1.0, 2.0])
  with jax.enable_x64(True):
    got = barron.fft_1d(dh=lambda t, m: m / jnp.cosh(m * t) ** 2, L=4040.0, N=2 ** 22,
                        params=jnp.asarray(mus, jnp.float64))
  np.testing.assert_allclose(np.asarray(got), np.abs(np.asarray(mus, float)), rtol=1e-6)
  # the sign correction of eq. 48: C for tanh(-mu t) is |mu|
  neg = barron.fft_1d(dh=_sech2(-0.1), L=440.0, N=2 ** 21)
  assert abs(float(neg) - 0.1) < 1e-7
  assert float(barron.closed_form("tanh", a=-0.1)) == pytest.approx(0.1, rel=1e-12)


@pytest.mark.parametrize("name,expected", [
    ("tanh", 1.0), ("tanh_half", 0.5), ("logistic", 0.25), ("erf", 2.0 / math.sqrt(math.pi))])
def test_activation_profiles_by_fft(name, expected):
  g, c = barron.PROFILES[name]
  assert c == pytest.approx(expected, rel=1e-15)
  got = float(barron.fft_1d(g, L=200.0, N=2 ** 20))  # gradient form through jax.grad
  assert got == pytest.approx(expected, rel=1e-6)
  assert float(barron.closed_form(name)) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("s", [0.5, 1.0, 2.0])
def test_gaussian_direct_fft(s):
  got = float(barron.fft_1d(lambda t: jnp.exp(-t * t / (2 * s * s)), L=200.0, N=2 ** 20,
                            form="direct"))
  assert got == pytest.approx(math.sqrt(2 / math.pi) / s, rel=1e-3)
  assert float(barron.closed_form("gaussian", s=s)) == pytest.approx(
      0.7978845608028654 / s, rel=1e-6)


def test_sech_direct_fft():
  got = float(barron.fft_1d(lambda t: 1 / jnp.cosh(t), L=200.0, N=2 ** 20, form="direct"))
  assert got == pytest.approx(8 * G / math.pi ** 2, rel=1e-3)
  assert 8 * G / math.pi ** 2 == pytest.approx(0.7424537, abs=1e-7)


def test_posdef_shortcut():
  for dh, c in ((_sech2(1.0), 1.0), (lambda t: 0.25 / jnp.cosh(t / 2) ** 2, 0.25),
                (lambda t: 2 / math.sqrt(math.pi) * jnp.exp(-t * t), 2 / math.sqrt(math.pi))):
    ok, v = barron.posdef_shortcut(dh)
    assert ok and float(v) == pytest.approx(c, rel=1e-12)
  ok, _ = barron.posdef_shortcut(lambda t: -jnp.tanh(t) / jnp.cosh(t))  # sech': odd
  assert not ok


# --- 2. q-D Gaussians ---------------------------------------------------------------------------

def _gauss_q(q, s=1.0):
  return math.sqrt(2) * math.exp(math.lgamma((q + 1) / 2) - math.lgamma(q / 2)) / s


def test_gaussian_table_values():
  for q, v in ((1, 0.7978846), (2, 1.2533141), (3, 1.5957691), (8, 2.7416247), (10, 3.0843278)):
    assert float(barron.closed_form("gaussian", q=q)) == pytest.approx(v, abs=1e-6)
    with jax.enable_x64(True):
      iso = float(barron.closed_form("gaussian_cov", cov=np.eye(q) * 2.25))
    assert iso == pytest.approx(_gauss_q(q, 1.5), rel=1e-10)


def test_gaussian_2d_fft():
  s = 1.3
  got = float(barron.fft_2d(lambda x: jnp.exp(-jnp.sum(x * x) / (2 * s * s)), L=30.0, N=1024))
  assert got == pytest.approx(_gauss_q(2, s), rel=1e-3)
  scales = np.array([0.8, 1.6])
  with jax.enable_x64(True):
    batched = barron.fft_2d(lambda x, sc: jnp.exp(-jnp.sum(x * x) / (2 * sc * sc)), L=30.0,
                            N=512, params=jnp.asarray(scales))
  np.testing.assert_allclose(np.asarray(batched), [_gauss_q(2, v) for v in scales], rtol=1e-3)


@pytest.mark.parametrize("q", [2, 8, 10])
def test_gaussian_mc_within_4_stderr(q):
  s = 0.7
  mix = barron.GaussianMixture(jnp.array([2.0]), jnp.zeros((1, q)), (s * s * jnp.eye(q))[None])
  est = barron.barron_constant(mix, key=jax.random.key(q), num_samples=50_000)
  assert est.method == "mc"
  assert abs(float(est.value) - 2.0 * _gauss_q(q, s)) <= 4 * float(est.stderr)
  assert float(est.stderr) < 0.02 * float(est.value)


def test_anisotropic_gaussian_closed_vs_fft_and_mc():
  rng = np.random.default_rng(0)
  M = rng.normal(size=(2, 2))
  cov = M @ M.T + 0.5 * np.eye(2)
  prec = np.linalg.inv(cov)
  with jax.enable_x64(True):
    closed = float(barron.closed_form("gaussian_cov", cov=cov))
  fft = float(barron.fft_2d(lambda x: jnp.exp(-0.5 * x @ jnp.asarray(prec) @ x), L=40.0, N=1024))
  assert fft == pytest.approx(closed, rel=1e-3)
  mix = barron.GaussianMixture(jnp.ones(1), jnp.zeros((1, 2)), jnp.asarray(cov)[None])
  est = barron.gaussian_mixture_mc(jax.random.key(1), mix, 50_000)
  assert abs(float(est.value) - closed) <= 4 * float(est.stderr)


def test_mixture_mc_below_triangle_bound():
  mix = barron.GaussianMixture(jnp.array([1.0, -0.7, 0.4]),
                               jnp.array([[0.0, 0.0, 0.0], [1.0, 0.5, 0.0], [-2.0, 0.0, 1.0]]),
                               jnp.stack([jnp.eye(3), 0.5 * jnp.eye(3), jnp.diag(jnp.array(
                                   [2.0, 1.0, 0.3]))]))
  est = barron.gaussian_mixture_mc(jax.random.key(2), mix, 50_000, batch=25_000)
  assert float(est.value) - 4 * float(est.stderr) <= float(mix.triangle_bound())
  # cancellation between components makes the constant strictly smaller
  assert float(est.value) + 4 * float(est.stderr) < float(mix.triangle_bound())


# --- 3. invariances -----------------------------------------------------------------------------

def test_translation_invariance():
  base = float(barron.fft_1d(dh=_sech2(0.7), L=200.0, N=2 ** 21))
  shifted = float(barron.fft_1d(dh=lambda t: 0.7 / jnp.cosh(0.7 * (t - 3.3)) ** 2, L=200.0,
                                N=2 ** 21))
  assert shifted == pytest.approx(base, rel=1e-6)
  g0 = float(barron.fft_1d(lambda t: jnp.exp(-t * t / 2), L=200.0, N=2 ** 20))
  g1 = float(barron.fft_1d(lambda t: jnp.exp(-(t + 5.1) ** 2 / 2), L=200.0, N=2 ** 20))
  assert g1 == pytest.approx(g0, rel=1e-6)


@pytest.mark.parametrize("scale", [0.5, -2.0, 3.0])
def test_scaling_and_amplitude(scale):
  g = lambda t: 1 / jnp.cosh(t)
  c = float(barron.fft_1d(g, L=200.0, N=2 ** 20))
  cs = float(barron.fft_1d(lambda t: g(scale * t), L=200.0, N=2 ** 20))
  assert cs == pytest.approx(abs(scale) * c, rel=1e-3)
  ca = float(barron.fft_1d(lambda t: scale * g(t), L=200.0, N=2 ** 20))
  assert ca == pytest.approx(abs(scale) * c, rel=1e-9)


def test_ridge_in_2d():
  w1 = 1.7
  got = float(barron.fft_2d(lambda x: jnp.exp(-0.5 * (w1 * x[0] + 0.3) ** 2), L=30.0, N=512))
  assert got == pytest.approx(w1 * math.sqrt(2 / math.pi), rel=1e-3)
  closed = float(barron.closed_form("ridge", w=[w1, 0.0], profile="gaussian"))
  assert closed == pytest.approx(w1 * math.sqrt(2 / math.pi), rel=1e-6)
  assert float(barron.closed_form("ridge", w=[3.0, 4.0], profile="tanh_half")) == pytest.approx(2.5)
  assert float(barron.closed_form("erf", a=[3.0, 4.0], A=-2.0)) == pytest.approx(
      10 * 2 / math.sqrt(math.pi), rel=1e-6)


def test_subadditivity():
  rng = np.random.default_rng(3)
  for _ in range(2):
    a1, a2, x0, al = rng.uniform(0.3, 2.0), rng.uniform(0.3, 2.0), rng.uniform(-2, 2), rng.normal()
    h1 = lambda t: jnp.tanh(a1 * t)
    h2 = lambda t: al * jnp.exp(-a2 * (t - x0) ** 2)
    c1 = float(barron.fft_1d(h1, L=200.0, N=2 ** 20))
    c2 = float(barron.fft_1d(h2, L=200.0, N=2 ** 20))
    c12 = float(barron.fft_1d(lambda t: h1(t) + h2(t), L=200.0, N=2 ** 20))
    assert c12 <= c1 + c2 + 1e-9
  # strict when the derivatives cancel: tanh(t) - tanh(t - 1)
  c = float(barron.fft_1d(lambda t: jnp.tanh(t) - jnp.tanh(t - 1.0), L=200.0, N=2 ** 20))
  assert c < 2.0 - 0.1


# --- network upper bound: try to break it with random networks --------------------------------

@pytest.mark.parametrize("act", ["tanh_half", "tanh", "logistic", "erf", "gaussian", "sech"])
def test_network_bound_dominates_fft_estimate(act):
  # A fixed seed per activation (Python's str hash is salted per process). Slopes stay away from
  # zero and offsets moderate so every unit's transition, and the tails of h', lie well inside the
  # FFT grid [-300, 300]: a unit wider than the grid is truncated and the *estimate* leaks
  # spectral mass (the bound itself holds for any slope).
  rng = np.random.default_rng(zlib.crc32(act.encode()))
  for trial in range(3):
    k = int(rng.integers(1, 12))
    slopes = rng.choice([-1.0, 1.0], size=(1, k)) * rng.uniform(0.3, 4.0, size=(1, k))
    params = {"a": jnp.asarray(slopes),
              "b": jnp.asarray(rng.uniform(-3.0, 3.0, size=(k,))),
              "c": jnp.asarray(rng.normal(size=(k,))), "c0": jnp.asarray(rng.normal())}
    h = lambda t: adversary_apply(params, jnp.reshape(t, (1, 1)), act)[0]
    est = float(barron.fft_1d(h, L=300.0, N=2 ** 20))
    bound = float(barron.network_upper_bound(params["a"], params["c"], act))
    assert est <= bound * (1 + 1e-6) + 1e-9, (act, trial, est, bound)
  # a single unit is tight: C = |c| |a| C_sigma
  h = lambda t: -0.8 * barron.PROFILES[act][0](1.5 * t + 0.2)
  est = float(barron.fft_1d(h, L=300.0, N=2 ** 20))
  bound = float(barron.network_upper_bound(jnp.array([[1.5]]), jnp.array([-0.8]), act))
  assert est == pytest.approx(bound, rel=1e-3)


def test_network_bound_shapes_and_errors():
  w1 = jnp.ones((3, 4))
  w2 = jnp.arange(8.0).reshape(4, 2)
  out = barron.network_upper_bound(w1, w2, "tanh")
  np.testing.assert_allclose(np.asarray(out), math.sqrt(3) * np.asarray(w2).sum(0), rtol=1e-6)
  with pytest.raises(ValueError, match="relu"):
    barron.network_upper_bound(w1, w2, "relu")
  with pytest.raises(ValueError, match="hidden units"):
    barron.network_upper_bound(w1, jnp.ones(5))


# --- dispatcher and errors ----------------------------------------------------------------------

def test_barron_constant_dispatch():
  e = barron.barron_constant(kind="tanh", a=0.3)
  assert e.method == "closed" and float(e.value) == pytest.approx(0.3)
  e = barron.barron_constant(jnp.tanh)
  assert e.method == "fft" and float(e.value) == pytest.approx(1.0, rel=1e-6)
  e = barron.barron_constant(lambda x: jnp.exp(-jnp.sum(x * x) / 2), q=2, N=512, L=25.0)
  assert float(e.value) == pytest.approx(_gauss_q(2), rel=1e-3)
  q = 5
  e = barron.barron_constant(
      q=q, fourier=lambda o: jnp.exp(-0.5 * jnp.sum(o * o)), key=jax.random.key(0),
      num_samples=100_000)
  assert abs(float(e.value) - _gauss_q(q)) <= 4 * float(e.stderr)


@pytest.mark.parametrize("q", [2.5, 0, -1, 2.0, True])
def test_closed_form_gaussian_dimension_is_an_integer_ge_1(q):
  """q is the dimension of R^q (Diaz et al., §2): 2.5 was truncated to 2, not refused."""
  with pytest.raises(options.OptionError, match=rf"q={q!r}: expected an integer >= 1"):
    barron.closed_form("gaussian", q=q)


@pytest.mark.parametrize("kind, kw, msg", [
    ("tanh", dict(a=float("nan")), r"a=nan: expected a number, not NaN"),
    ("tanh", dict(a=float("inf")), r"a=inf: expected a finite number"),
    ("erf", dict(a=[1.0, float("nan")]), r"a: 1 entries are NaN .*index \(1,\)"),
    ("tanh", dict(A=float("nan")), r"A=nan"),
    ("tanh", dict(b=float("-inf")), r"b=-inf"),
    ("gaussian", dict(s=float("nan")), r"s=nan"),
    ("gaussian", dict(s=np.array([1.0, -2.0])), r"s\[1\]=-2.0: expected a number > 0"),
    ("gaussian_cov", dict(cov=[[1.0, np.nan], [np.nan, 1.0]]), r"cov: 2 entries are NaN"),
    ("ridge", dict(w=[1.0, np.inf]), r"w: 1 entries"),
    ("ridge", dict(w=[1.0], profile_constant=-0.5), r"profile_constant=-0.5: .* >= 0")])
def test_closed_form_rejects_nan_inf_and_out_of_range_values(kind, kw, msg):
  with pytest.raises(options.OptionError, match=msg):
    barron.closed_form(kind, **kw)


@pytest.mark.parametrize("kind, kw, bad", [
    ("tanh", dict(mu=2), "mu"), ("tanh", dict(bogus=5), "bogus"),
    ("gaussian", dict(a=2.0), "a"), ("gaussian_cov", dict(cov=np.eye(2), s=2.0), "s"),
    ("ridge", dict(w=[1.0], q=3), "q")])
def test_closed_form_rejects_keywords_its_kind_does_not_take(kind, kw, bad):
  """closed_form(kind="tanh", mu=2) returned 1.0 (mu ignored): the keyword is named with the
  ones the kind takes."""
  takes = ", ".join(barron.CLOSED_FORM_KEYWORDS[kind])
  with pytest.raises(TypeError, match=rf"'{bad}' with kind='{kind}'; it takes {takes}"):
    barron.closed_form(kind, **kw)


def test_closed_form_accepts_every_documented_keyword_and_traced_values():
  assert float(barron.closed_form("tanh", a=[3.0, 4.0], b=0.3, A=-2.0)) == pytest.approx(10.0)
  assert float(barron.closed_form("gaussian", s=2.0, q=np.int64(2), A=1.0)) == pytest.approx(
      _gauss_q(2, 2.0), rel=1e-12)
  assert float(barron.closed_form("ridge", w=[3.0, 4.0], b=1.0, profile_constant=0.5,
                                  A=1.0)) == pytest.approx(2.5)
  traced = jax.jit(lambda a: barron.closed_form("tanh", a=a))(jnp.array([3.0, 4.0]))
  assert float(traced) == pytest.approx(5.0, rel=1e-6)
  # barron_constant's own q is the Gaussian's dimension (it was dropped: q=1 was used)
  assert float(barron.barron_constant(kind="gaussian", q=3).value) == pytest.approx(
      _gauss_q(3), rel=1e-12)


def test_errors():
  with pytest.raises(ValueError, match="power of two"):
    barron.fft_1d(jnp.tanh, N=1000)
  with pytest.raises(ValueError, match="give h or dh"):
    barron.fft_1d()
  with pytest.raises(ValueError, match="unknown kind"):
    barron.closed_form("relu")
  with pytest.raises(options.OptionError, match=r"s=-1.0: expected a number > 0"):
    barron.closed_form("gaussian", s=-1.0)
  with pytest.raises(TypeError, match="kind='ridge' needs the keyword 'w'"):   # was a KeyError
    barron.closed_form("ridge", profile="tanh")
  with pytest.raises(ValueError, match="positive definite"):
    barron.closed_form("gaussian_cov", cov=[[1.0, 0.0], [0.0, -1.0]])
  with pytest.raises(ValueError, match="q=3 > 2"):
    barron.barron_constant(lambda x: x.sum(), q=3)
  with pytest.raises(ValueError, match="PRNG key"):
    barron.barron_constant(q=3, method="mc", fourier=lambda o: 1.0)
  with pytest.raises(ValueError, match="means"):
    barron.GaussianMixture(jnp.ones(2), jnp.zeros((1, 2)), jnp.eye(2)[None])


def test_fft_grid_of_samples():
  N, L = 512, 20.0
  t = (np.arange(N) - N // 2) * (2 * L / N)
  x1, x2 = np.meshgrid(t, t, indexing="ij")
  g = np.exp(-(x1 ** 2 + x2 ** 2) / 2)
  assert float(barron.fft_grid(g, L)) == pytest.approx(_gauss_q(2), rel=1e-3)
  grad = np.stack([-x1 * g, -x2 * g])
  assert float(barron.fft_grid(grad, L, form="gradient")) == pytest.approx(_gauss_q(2), rel=1e-3)
  t1 = (np.arange(2 ** 16) - 2 ** 15) * (400.0 / 2 ** 16)
  assert float(barron.fft_grid(np.exp(-t1 ** 2 / 2), 200.0)) == pytest.approx(
      _gauss_q(1), rel=1e-3)
  with pytest.raises(ValueError, match="powers of two"):
    barron.fft_grid(np.zeros((100, 100)), L)
  with pytest.raises(ValueError, match="q = 1, 2"):
    barron.fft_grid(np.zeros((16, 16, 16)), L)


# --- FFT on non-decaying gradients: window truncation, resolution checks ------------------------
# A ridge g(w . x) in 2-D has a gradient that does not decay along the ridge. Cut off by the
# FFT window, its periodic extension jumps at the border of a tilted ridge, the jump leaks
# spectral mass ~ 1/|omega| over the whole grid, and sum |F| grows like log N: the untapered
# estimate of tanh(x.w/2), |w| = 1 (exact 1/2), was 1.46, 1.60, 1.74, 1.88 at N = 128 ... 1024.

_TILT = np.array([math.cos(0.6), math.sin(0.6)])


def _tilted_ridge(x):
  return jnp.tanh(0.5 * (x @ jnp.asarray(_TILT)) + 0.1)


def _train_2d(act: str, k: int = 8, steps: int = 400, seed: int = 0) -> tuple[dict, callable]:
  """A width-k two-layer network fitted to a 2-D sign pattern (a trained adversary, eq. 5)."""
  import optax
  k1, k2 = jax.random.split(jax.random.key(seed))
  T = jax.random.normal(k1, (512, 2))
  S = jnp.sign(T[:, 0] * T[:, 1] + 0.3 * T[:, 0])
  f = {"logistic": jax.nn.sigmoid, "relu": jax.nn.relu}[act]
  apply = lambda p, x: p["c0"] + f(x @ p["a"] + p["b"]) @ p["c"]
  p = {"a": jax.random.normal(k2, (2, k)), "b": jnp.zeros(k), "c": jnp.zeros(k),
       "c0": jnp.zeros(())}
  opt = optax.adam(3e-2)
  st = opt.init(p)

  @jax.jit
  def step(p, st):
    g = jax.grad(lambda p: jnp.mean((apply(p, T) - S) ** 2))(p)
    u, st = opt.update(g, st)
    return optax.apply_updates(p, u), st

  for _ in range(steps):
    p, st = step(p, st)
  p = jax.tree.map(lambda v: np.asarray(v, np.float64), p)
  return p, lambda x: apply(p, x[None])[0]


def test_fft_2d_tilted_ridge_tapered_to_exact_value():
  exact = float(barron.closed_form("ridge", w=_TILT, profile="tanh_half"))
  assert exact == pytest.approx(0.5, rel=1e-12)
  for N in (256, 512):  # offset 0.1: the taper biases low by 1e-3 at L = 30, 1e-11 at 60
    got = float(barron.fft_2d(_tilted_ridge, L=30.0, N=N))
    assert exact * (1 - 2e-3) <= got <= exact * (1 + 1e-9), N
  assert float(barron.fft_2d(_tilted_ridge, L=60.0, N=512)) == pytest.approx(exact, rel=1e-9)
  centred = lambda x: jnp.tanh(0.5 * (x @ jnp.asarray(_TILT)))  # F(g') >= 0: exact
  assert float(barron.fft_2d(centred, L=30.0, N=256)) == pytest.approx(exact, rel=1e-9)
  # a Gaussian profile (F(g') changes sign): the taper biases low, never high (Young's inequality)
  w = 1.7 * _TILT
  ridge = lambda x: jnp.exp(-0.5 * (x @ jnp.asarray(w) + 0.3) ** 2)
  exact = 1.7 * math.sqrt(2 / math.pi)
  got = float(barron.fft_2d(ridge, L=60.0, N=512))
  assert exact * (1 - 1e-2) <= got <= exact * (1 + 1e-6)
  # untapered, the estimate is the divergent one described above
  assert float(barron.fft_2d(_tilted_ridge, L=30.0, N=512, taper="none")) > 1.5


@pytest.mark.parametrize("case", ["tanh_half_1d", "sech_1d", "gaussian_2d", "tilted_ridge_2d",
                                  "axis_ridge_2d"])
def test_fft_estimate_within_its_stated_error(case):
  if case == "tanh_half_1d":
    est = barron.barron_constant(barron.PROFILES["tanh_half"][0], method="fft")
    exact = float(barron.closed_form("tanh_half"))
  elif case == "sech_1d":
    est = barron.barron_constant(lambda t: 1 / jnp.cosh(t), method="fft", N=2 ** 16, L=100.0)
    exact = 8 * G / math.pi ** 2
  elif case == "gaussian_2d":
    s = 1.3
    est = barron.barron_constant(lambda x: jnp.exp(-jnp.sum(x * x) / (2 * s * s)), q=2,
                                 method="fft", L=30.0, N=512)
    exact = float(barron.closed_form("gaussian", s=s, q=2))
  elif case == "tilted_ridge_2d":
    est = barron.barron_constant(_tilted_ridge, q=2, method="fft", L=30.0, N=512)
    exact = float(barron.closed_form("ridge", w=_TILT, profile="tanh_half"))
  else:
    est = barron.barron_constant(lambda x: jnp.exp(-0.5 * (1.7 * x[0] + 0.3) ** 2), q=2,
                                 method="fft", L=30.0, N=512)
    exact = float(barron.closed_form("ridge", w=[1.7, 0.0], profile="gaussian"))
  assert est.method == "fft"
  assert est.converged, (case, float(est.value), float(est.error))
  assert 0 <= float(est.error) <= 1e-2 * exact
  assert abs(float(est.value) - exact) <= float(est.error), (case, float(est.value), exact,
                                                              float(est.error))


@pytest.mark.parametrize("act", ["logistic", "relu"])
def test_fft_never_exceeds_proven_bound_unflagged(act):
  p, h = _train_2d(act)
  if act == "logistic":
    bound = float(barron.network_upper_bound(p["a"], p["c"], "logistic"))
  else:  # ReLU: C = infinity, every finite value is wrong; it must be flagged
    bound = -math.inf
  for L, N in ((30.0, 256), (20.0, 512)):
    est = barron.barron_constant(h, q=2, method="fft", L=L, N=N)
    assert math.isfinite(float(est.value)) and float(est.error) >= 0
    assert float(est.value) <= bound * (1 + 1e-6) or not est.converged, (
        act, L, N, float(est.value), bound, float(est.error))
    if act == "logistic":  # the taper's guarantee (Young): below C_h <= bound even unconverged
      assert float(est.value) <= bound * (1 + 1e-6)
    else:
      assert not est.converged
  if act == "relu":
    with pytest.raises(ValueError, match="did not converge"):
      barron.barron_constant(h, q=2, method="fft", L=30.0, N=256, strict=True)


def test_fft_tilted_ridge_never_exceeds_bound_unflagged():
  bound = float(barron.network_upper_bound(_TILT[:, None], np.array([1.0]), "tanh_half"))
  for L, N in ((15.0, 128), (30.0, 256), (60.0, 512)):
    est = barron.barron_constant(_tilted_ridge, q=2, method="fft", L=L, N=N)
    assert float(est.value) <= bound * (1 + 1e-6) or not est.converged, (L, N, est)
  # an under-resolved grid (dt = 0.94 for a transition of width 1/8) is flagged, not reported
  steep = lambda x: jnp.tanh(8.0 * (x @ jnp.asarray(_TILT)) + 0.3)
  for N in (64, 128):
    assert not barron.barron_constant(steep, q=2, method="fft", L=30.0, N=N).converged
  est = barron.barron_constant(steep, q=2, method="fft", L=30.0, N=512)
  assert est.converged and float(est.value) == pytest.approx(8.0, rel=1e-6)


def test_fft_check_needs_refinable_grid():
  with pytest.raises(ValueError, match="N >= 32"):
    barron.barron_constant(jnp.tanh, method="fft", N=16)
  e = barron.barron_constant(kind="tanh", a=0.3)
  assert e.converged and float(e.error) == 0.0
