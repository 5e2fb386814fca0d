"""A lower bound on β*_c by gradient search: real leaking inputs (``attack <= β*_c <= β``)."""

from __future__ import annotations

import math
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from milp import network as net_lib
from milp.idpdb.config import AttackResult
from milp.idpdb.family import as_family, check_compatible, check_label, confidence
from milp.ldcp import Family
from milp.network import Network


def attack(net: Network, members: Sequence[Network] | Family, label: int, starts: int = 1024,
           steps: int = 300, lr: float = 0.02, penalty: float = 20.0, key: Any = 0,
           search_members: int | None = None) -> AttackResult:
  """A lower bound on beta*_c by search: the best leaking confidence found, confirmed in float64.

  Projected sign-gradient ascent (vmapped over ``starts`` uniform points of [0, 1]^d, float32
  JAX) on ``C^c_N(x) - penalty * relu(min_i C^c_{N_-i}(x) + 1e-4)``, i.e. on N's confidence with
  a penalty until some member disagrees. The final points are replayed in float64 through N and
  every member; among those where a member disagrees (``C^c_{N_-i}(x) <= 0``) the largest
  ``C^c_N(x)`` is returned with its input and member (`AttackResult`; confidence ``-inf`` and
  no input if none). Every ``x`` returned is a real leaking input, so
  ``result.confidence <= beta*_c <= beta``.

  ``key``: a JAX PRNG key (or an int seed for one) for the starting points and the subset.
  ``search_members`` caps the members inside the gradient search (a random subset; the
  search costs ``starts * members`` forward passes per step, too much for a whole leave-one-out
  family of Adult); the float64 replay still checks every member of the family.
  """
  family = as_family(members, net.output)
  check_compatible(net, family.member(0), "the family")
  label = check_label(net, label)
  key = jax.random.PRNGKey(key) if isinstance(key, (int, np.integer)) else key
  k_starts, k_subset = jax.random.split(key)
  searched = family
  if search_members is not None and search_members < family.size:
    if search_members < 1:
      raise ValueError(f"attack: search_members must be >= 1, got {search_members}.")
    pick = np.sort(np.asarray(jax.random.choice(k_subset, family.size, (search_members,),
                                                replace=False)))
    searched = family.select(pick)
  ws = [jnp.asarray(w, jnp.float32) for w in searched.ws]
  bs = [jnp.asarray(b, jnp.float32) for b in searched.bs]
  nw = [jnp.asarray(l.w_lower, jnp.float32) for l in net.layers]
  nb = [jnp.asarray(l.b_lower, jnp.float32) for l in net.layers]

  def conf(z):
    if z.shape[-1] == 1:
      return z[..., 0] if label == 1 else -z[..., 0]
    others = jnp.delete(z, label, axis=-1, assume_unique_indices=True)
    return z[..., label] - jnp.max(others, axis=-1)

  def objective(x):
    h = x
    for m, (w, b) in enumerate(zip(nw, nb)):
      h = w @ h + b
      h = jax.nn.relu(h) if m < len(nw) - 1 else h
    g = jnp.broadcast_to(x, (searched.size, x.size))
    for m, (w, b) in enumerate(zip(ws, bs)):
      g = jnp.einsum("koi,ki->ko", w, g) + b
      g = jax.nn.relu(g) if m < len(ws) - 1 else g
    return conf(h) - penalty * jax.nn.relu(jnp.min(conf(g)) + 1e-4)

  grad = jax.vmap(jax.grad(objective))

  @jax.jit
  def run(x0):
    def step(x, _):
      return jnp.clip(x + lr * jnp.sign(grad(x)), 0.0, 1.0), None
    return jax.lax.scan(step, x0, None, length=steps)[0]

  x0 = jax.random.uniform(k_starts, (starts, net.input_size))
  xs = np.asarray(run(x0), np.float64)
  c_n = confidence(net, net_lib.forward_batch(net, xs), label)
  c_m = confidence(net, family.outputs(xs), label)            # (K, starts)
  leaking = np.min(c_m, axis=0) <= 0.0
  if not leaking.any():
    return AttackResult(-math.inf, None, None)
  best = int(np.flatnonzero(leaking)[np.argmax(c_n[leaking])])
  return AttackResult(float(c_n[best]), xs[best], int(np.argmin(c_m[:, best])))
