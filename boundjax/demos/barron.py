"""The ``barron`` section of ``boundjax demo``: the Gaussian auditing example at CPU scale."""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp

from boundjax import barron
from boundjax.auditing import (AdversaryConfig, audit_representation, sample_gaussian_example,
                               true_min_loss)
from boundjax.demos.common import Section


# Printed by ``boundjax demo`` before the section runs.
TITLE = "Barron-constant auditing, the Gaussian example"
# ``boundjax demo --quick``: smaller sizes and fewer steps (keyword arguments of `run`).
QUICK: dict = {"n": 2000, "k": 8, "trials": 1, "epochs": 1, "mus": (0.1,)}
# Wall seconds of the section on a quiet 2-core CPU, full and ``--quick``: the CPU seconds it
# took (``boundjax demo --json``, 2026-11-27, a shared 2-core machine) scaled by the ratio of
# the full demo's quiet wall time (85 s) to its CPU seconds. Printed as the expected time.
SECONDS = {"full": 5.8, "quick": 1.7}


def run(seed: int = 0, n: int = 20000, k: int = 64, trials: int = 8, epochs: int = 5,
        mus: Sequence[float] = (0.02, 0.1), delta: float = 0.01) -> Section:
  """A short text report for ``boundjax demo``: the Gaussian example at a small, CPU-sized scale.

  For each ``mu``: ``C_eta = |mu|`` (closed form, checked by FFT), the true minimal loss (eq. 50),
  the best adversary's loss, the Theorem 1 gap and the lower bound with its ratio.
  """
  lines = [f"Barron auditing (Diaz et al.): n={n}, k={k}, {trials} restarts x {epochs} epochs, "
           f"delta={delta}",
           f"{'mu':>6} {'C_eta':>8} {'C_fft':>8} {'L_true':>8} {'L_emp':>8} {'gap':>8} "
           f"{'bound':>8} {'ratio':>6}"]
  key = jax.random.key(seed)
  rows = []
  cfg = AdversaryConfig(k=k, trials=trials, epochs=epochs, batch=512)
  for mu in mus:
    key, k1, k2 = jax.random.split(key, 3)
    T, S = sample_gaussian_example(k1, n, mu)
    c_fft = float(barron.fft_1d(dh=lambda t: mu / jnp.cosh(mu * t) ** 2, L=40 / mu + 40,
                                N=2 ** 20))
    cert, _ = audit_representation(k2, T, S, abs(mu), (-3.0, 3.0), delta, cfg)
    rows.append({"mu": mu, "C_eta": abs(mu), "C_fft": c_fft, "L_true": true_min_loss(mu),
                 "L_emp": cert.L_emp, "gap": cert.gap, "lower_bound": cert.lower_bound,
                 "ratio": cert.ratio})
    lines.append(f"{mu:6.3f} {abs(mu):8.4f} {c_fft:8.4f} {true_min_loss(mu):8.5f} "
                 f"{cert.L_emp:8.5f} {cert.gap:8.5f} {cert.lower_bound:8.5f} {cert.ratio:6.3f}")
  return Section("\n".join(lines), {"rows": rows, "delta": delta})
