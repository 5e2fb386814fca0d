"""Finite adversaries: approximate ERM over ``H_k`` by many restarts (Diaz et al., §5.4 and Fig. 1).

A finite adversary is a two-layer network with ``k`` hidden units, ``h(T) = c0 + sum_i c_i
sigma(a_i . T + b_i)`` (eq. 5, sigma(t) = tanh(t/2)), fitted to predict ``S in {-1, +1}`` from
``T`` with the squared loss. Each restart is one `boundjax.training.scan_steps` per epoch over a
`boundjax.training.Schedule` (shuffled every epoch from the restart's key, last partial batch
dropped); restarts run vmapped and jitted (`fit_finite_adversary`). `audit_representation` turns
the best loss into Theorem 1's `AuditCertificate` (`boundjax.auditing.gaps`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from typing import Any, Iterator, Literal

import jax
import jax.numpy as jnp
import numpy as np
import optax

from boundjax import training
from boundjax.auditing.gaps import AuditCertificate, certify, radius_term, thm1_gap
from boundjax.barron import profile
from boundjax.training import Schedule

Array = jax.Array


# ----------------------------------------------------------------------------------------------
# Finite adversaries: approximate ERM over H_k (Diaz et al., §5.4)
# ----------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class AdversaryConfig:
  """Training setup for finite adversaries (the paper leaves most of it open; these are our defaults).

  Trials are split evenly between the optimisers in ``optimizers`` (Adam lr 1e-3; SGD lr 1e-2 with
  momentum 0.9 [IMPL]); Glorot-uniform first layer, zero biases and output weights [IMPL];
  activation ``tanh(t/2)`` (eq. 5). The whole-sample loss is evaluated after every epoch and the
  minimum over trials and epochs is reported (paper §5.4).
  """
  k: int = 1000
  trials: int = 512
  epochs: int = 30
  optimizers: tuple[str, ...] = ("adam", "sgd")
  lr_adam: float = 1e-3
  lr_sgd: float = 1e-2
  momentum: float = 0.9
  batch: int = 1024
  activation: str = "tanh_half"
  trial_chunk: int = 512     # trials per vmapped call (memory control)
  eval_chunk: int = 4096     # samples per chunk of the whole-sample loss

  def __post_init__(self):
    for name in ("k", "trials", "epochs", "batch", "trial_chunk", "eval_chunk"):
      if getattr(self, name) < 1:
        raise ValueError(f"AdversaryConfig.{name} must be >= 1, got {getattr(self, name)}.")
    for o in self.optimizers:
      if o not in ("adam", "sgd"):
        raise ValueError(f"AdversaryConfig.optimizers: unknown optimiser {o!r} (adam, sgd).")
    if not self.optimizers:
      raise ValueError("AdversaryConfig.optimizers must not be empty.")


@dataclasses.dataclass(frozen=True)
class AdversaryResult:
  """Outcome of `fit_finite_adversary`.

  ``best_loss`` = ``min`` over trials and epochs of the whole-sample loss (the approximate
  ``L_{k,S_n}``); ``best_params`` its network; ``curves[trial, epoch]`` every whole-sample loss;
  ``optimizer[trial]`` the optimiser's name per trial; ``seconds`` the wall time.
  """
  best_loss: float
  best_params: dict
  curves: np.ndarray
  optimizer: tuple[str, ...]
  seconds: float


def adversary_apply(params: dict, T: Array, activation: str = "tanh_half") -> Array:
  """``h(T) = c0 + sum_i c_i sigma(a_i . T + b_i)`` (eq. 5) for ``T [n, q]``; returns ``[n]``."""
  g, _ = profile(activation)
  return params["c0"] + g(T @ params["a"] + params["b"]) @ params["c"]


def init_adversary(key: Array, q: int, k: int) -> dict:
  """Glorot-uniform ``a [q, k]``; zero ``b [k]``, ``c [k]``, ``c0`` (our initialisation; the paper does not state one)."""
  lim = math.sqrt(6.0 / (q + k))
  return {"a": jax.random.uniform(key, (q, k), jnp.float32, -lim, lim),
          "b": jnp.zeros((k,), jnp.float32), "c": jnp.zeros((k,), jnp.float32),
          "c0": jnp.zeros((), jnp.float32)}


def _optimizer(name: str, cfg: AdversaryConfig) -> optax.GradientTransformation:
  if name == "adam":
    return optax.adam(cfg.lr_adam)
  return optax.sgd(cfg.lr_sgd, momentum=cfg.momentum)


def _full_loss(params: dict, T: Array, S: Array, cfg: AdversaryConfig) -> Array:
  """Mean squared loss on the whole sample, evaluated in chunks of ``cfg.eval_chunk``."""
  n = T.shape[0]
  c = min(cfg.eval_chunk, n)
  m = n // c
  head = jax.lax.map(
      lambda ts: jnp.sum((ts[1] - adversary_apply(params, ts[0], cfg.activation)) ** 2),
      (T[:m * c].reshape(m, c, -1), S[:m * c].reshape(m, c)))
  tail = jnp.sum((S[m * c:] - adversary_apply(params, T[m * c:], cfg.activation)) ** 2)
  return (jnp.sum(head) + tail) / n


def schedule(n: int, cfg: AdversaryConfig) -> Schedule:
  """The data order of one restart: batches of ``min(cfg.batch, n)``, reshuffled every epoch
  (from the restart's key), the last partial batch dropped."""
  return Schedule(n=n, batch_size=min(cfg.batch, n), epochs=cfg.epochs, shuffle="epoch",
                  last_batch="drop")


def _train_one(key: Array, T: Array, S: Array, cfg: AdversaryConfig, opt_name: str):
  """Trains one adversary; returns (best whole-sample loss, its params, per-epoch losses).

  Epoch by epoch: `boundjax.training.scan_steps` over the epoch's batches (mean squared loss),
  then the whole-sample loss; the best parameters over epochs are kept (paper §5.4).
  """
  opt = _optimizer(opt_name, cfg)
  n, q = T.shape
  sched = schedule(n, cfg)
  k_init, k_order = jax.random.split(key)
  params = init_adversary(k_init, q, cfg.k)
  rows = sched.batches(k_order).reshape(cfg.epochs, sched.steps_per_epoch, sched.batch_size)
  grad_fn = training.mean_gradient(lambda p, t: adversary_apply(p, t, cfg.activation),
                                   lambda h, s: (s - h) ** 2)

  def epoch(carry, epoch_rows):
    p, s, best, best_p = carry
    (p, s), _ = training.scan_steps(grad_fn, opt, (p, s), T, S, epoch_rows)
    L = _full_loss(p, T, S, cfg)
    better = L < best
    best_p = jax.tree.map(lambda x, y: jnp.where(better, x, y), p, best_p)
    return (p, s, jnp.minimum(L, best), best_p), L

  init = (params, opt.init(params), jnp.asarray(jnp.inf, jnp.float32), params)
  (_, _, best, best_p), curve = jax.lax.scan(epoch, init, rows)
  return best, best_p, curve


@functools.partial(jax.jit, static_argnames=("cfg", "opt_name"))
def _train_many(keys: Array, T: Array, S: Array, cfg: AdversaryConfig, opt_name: str):
  """``vmap`` of `_train_one` over restart keys: many adversaries in one compiled run."""
  return jax.vmap(lambda k: _train_one(k, T, S, cfg, opt_name))(keys)


@functools.partial(jax.jit, static_argnames=("cfg", "opt_name"))
def _train_single(key: Array, T: Array, S: Array, cfg: AdversaryConfig, opt_name: str):
  return _train_one(key, T, S, cfg, opt_name)


def _check_data(T: Any, S: Any) -> tuple[Array, Array]:
  T = jnp.asarray(T, jnp.float32)
  S = jnp.asarray(S, jnp.float32)
  if T.ndim == 1:
    T = T[:, None]
  if T.ndim != 2 or S.shape != (T.shape[0],):
    raise ValueError(f"adversary data: expected T [n, q] and S [n], got {T.shape} and {S.shape}.")
  s_np = np.asarray(S)
  if not np.all((s_np == 1.0) | (s_np == -1.0)):
    raise ValueError("adversary data: S must take values in {-1, +1} (map 0/1 labels by 2 S - 1).")
  if not np.all(np.isfinite(np.asarray(T))):
    raise ValueError("adversary data: T contains NaN or Inf.")
  return T, S


def fit_finite_adversary(key: Array, T: Any, S: Any, cfg: AdversaryConfig = AdversaryConfig(),
                         *, vmapped: bool = True, progress: bool = False) -> AdversaryResult:
  """Approximate ERM over ``H_k``: ``cfg.trials`` random restarts, best whole-sample loss.

  Trials are split evenly over ``cfg.optimizers``; each group runs as one vmapped, jitted call
  per chunk of ``cfg.trial_chunk`` trials (``vmapped=False`` trains them one by one with the same
  compiled per-trial function, for benchmarking). The returned loss is an *upper* estimate of the
  exact ``L_{k,S_n}`` (ERM over ``H_k`` is NP-hard).
  """
  T, S = _check_data(T, S)
  names = []
  per = [cfg.trials // len(cfg.optimizers)] * len(cfg.optimizers)
  for i in range(cfg.trials - sum(per)):
    per[i] += 1
  best, best_p, curves = np.inf, None, []
  keys_all = jax.random.split(key, cfg.trials)
  start = 0
  t0 = time.perf_counter()
  bar = None
  if progress:
    from tqdm.auto import tqdm
    bar = tqdm(total=cfg.trials, desc="adversaries", unit="trial")
  for name, m in zip(cfg.optimizers, per):
    keys = keys_all[start:start + m]
    start += m
    for j in range(0, m, cfg.trial_chunk if vmapped else 1):
      kk = keys[j:j + (cfg.trial_chunk if vmapped else 1)]
      if vmapped:
        b, p, c = _train_many(kk, T, S, cfg, name)
      else:
        b, p, c = _train_single(kk[0], T, S, cfg, name)
        b, c = b[None], c[None]
        p = jax.tree.map(lambda x: x[None], p)
      b = np.asarray(b)
      i = int(np.argmin(b))
      if b[i] < best:
        best, best_p = float(b[i]), jax.tree.map(lambda x: np.asarray(x[i]), p)
      curves.append(np.asarray(c))
      names += [name] * len(kk)
      if bar is not None:
        bar.update(len(kk))
  if bar is not None:
    bar.close()
  return AdversaryResult(best, best_p, np.concatenate(curves, 0), tuple(names),
                         time.perf_counter() - t0)


@dataclasses.dataclass(frozen=True)
class AuditResult:
  """Result of `audit_representation`: the certificate and the adversaries behind it.

  Unpacks as ``certificate, adversary = audit_representation(...)``.
  """
  certificate: AuditCertificate
  adversary: AdversaryResult

  def __iter__(self) -> Iterator[Any]:
    return iter((self.certificate, self.adversary))


def audit_representation(key: Array, T: Any, S: Any, C_eta: float, K: Any, delta: float = 0.01,
                         cfg: AdversaryConfig = AdversaryConfig(),
                         hoeffding: Literal["eq22", "eq31"] = "eq22",
                         progress: bool = False) -> AuditResult:
  """Theorem 1 audit: trains the finite adversaries on ``(T, S)`` and returns the certificate.

  ``K`` is the support of ``T`` (box or points; see `radius_term`), ``C_eta`` the Barron constant
  of ``E[S | T]`` (known model, or an estimate — then the result is an estimate too).
  """
  T, S = _check_data(T, S)
  res = fit_finite_adversary(key, T, S, cfg, progress=progress)
  gap = float(thm1_gap(T.shape[0], cfg.k, delta, radius_term(K), C_eta, hoeffding))
  cert = certify(res.best_loss, gap, erm_exact=False, assumptions=(
      f"T supported in K with radius term {radius_term(K):.4g}",
      f"C_eta = {C_eta:.6g}", f"delta = {delta}"))
  return AuditResult(cert, res)
