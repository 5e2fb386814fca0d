"""When are AGT's certificates vacuous? Evidence for `boundjax.agt.diagnostics.VacuityCheck`.

`agt.fit` warns (`VacuousCertificateWarning`) when its box certifies (almost) nothing. Two
candidate rules, measured on the same runs:

* the width rule (the old one): some leaf's mean box width exceeds ``t`` times its layer's mean
  ``|w|`` (`BoxStats.ratio`), with ``t = 1`` (old default) or ``t = 0.5``;
* the probe rule (the new default): fewer than 25 % of a probe of 256 training points (the
  first of the schedule's order) are certified by the box (AGT, Lemma 4.4).

Each run is one AGT fit; the table records the final box's largest width ratio, the certified
fraction of the training probe and of the test set, and which rules fire. A good rule fires on
every run that certifies (almost) nothing on the test set and on no run that certifies most.

Task: AGT's blobs, "overlapping" setting (`boundjax.data.make_blobs`, raw features, 2,000
training points and the generator's test split), cross-entropy, 4 epochs, eta 0.3, lr_min 1e-3,
sound mode, float32, interval bounds. 6-32-2 ReLU around b = 500, gamma = 0.06, alpha = 0.5:
k = 1 ... 50, and gamma = 0.2, b = 125, alpha = 2 alone; 6-64-64-2 ReLU full-batch (b = 2000,
gamma = 0.02, alpha = 0.2) at k = 1, 5, 20. (`benchmarks/agt_settings.py` varies the knobs on
5,000 points with b = 1000 on 6-32-2 only.)

  JAX_PLATFORMS=cpu .venv/bin/python benchmarks/agt_vacuity.py

Result: benchmarks/results/agt_vacuity.json (and the table printed).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import warnings

import jax
import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

import boundjax.data as bd
from boundjax import agt
from boundjax.agt import diagnostics, mlp
from common import RESULTS, record

#: (network, changes to the base config): a k sweep through the range where certification
#: collapses, the other knobs at one bad value each, and a deeper network trained full-batch.
RUNS = ([([6, 32, 2], {"k_private": k}) for k in (1, 5, 10, 15, 20, 30, 50)]
        + [([6, 32, 2], change) for change in ({"clip_gamma": 0.2}, {"batch_size": 125},
                                               {"learning_rate": 2.0})]
        + [([6, 64, 64, 2], dict(batch_size=2000, fragsize=1000, clip_gamma=0.02,
                                 learning_rate=0.2, k_private=k)) for k in (1, 5, 20)])
MOST, NOTHING = 0.5, 0.1     # "certifies most" / "certifies (almost) nothing" on the test set


def one_run(sizes, X, y, Xt, cfg) -> dict:
  """One fit without validation data (so the probe rule is the one `fit` applies)."""
  params = mlp.init(jax.random.PRNGKey(0), sizes, jnp.float32)
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    res = agt.fit(mlp.apply, params, X, y, cfg, progress=False)
  fired = any(issubclass(w.category, agt.VacuousCertificateWarning) for w in caught)
  rec = res.history[-1]
  test = float(np.mean(agt.certify(mlp.apply, res.params, res.bounds, Xt)))
  ratio = float(max(rec.width_ratio))
  return dict(max_width_ratio=ratio, probe_certified=rec.probe_certified, test_certified=test,
              fires_probe_rule=fired, fires_ratio_1=ratio > 1.0, fires_ratio_05=ratio > 0.5)


def score(rows: list[dict], rule: str) -> dict:
  """Misses (runs certifying < NOTHING with no warning) and false alarms (>= MOST, warned)."""
  return dict(missed=sum(r["test_certified"] < NOTHING and not r[rule] for r in rows),
              false_alarms=sum(r["test_certified"] >= MOST and r[rule] for r in rows))


def run() -> dict:
  d = bd.make_blobs("overlapping", n_train=2000, seed=0, scale=False)
  X, y = jnp.asarray(d.x_train, jnp.float32), jnp.asarray(d.y_train)
  Xt = jnp.asarray(d.x_test, jnp.float32)
  base = agt.Config(n_epochs=4, learning_rate=0.5, batch_size=500, loss="cross_entropy",
                    k_private=5, clip_gamma=0.06, lr_decay=0.3, lr_min=1e-3, sound=True,
                    fragsize=500)
  rows = []
  print(f"{'net':>10} {'change to the base':>40} {'w/|w|':>7} {'probe':>6} {'test':>6}  "
        "fires (probe, >1, >0.5)")
  for sizes, change in tqdm(RUNS, desc="AGT runs"):
    cfg = dataclasses.replace(base, **change)
    r = dict(net="-".join(map(str, sizes)), change=change, **one_run(sizes, X, y, Xt, cfg))
    rows.append(r)
    print(f"{r['net']:>10} {str(change):>40} {r['max_width_ratio']:7.3g} "
          f"{r['probe_certified']:6.3f} {r['test_certified']:6.3f}  {r['fires_probe_rule']!s:>5} "
          f"{r['fires_ratio_1']!s:>5} {r['fires_ratio_05']!s:>5}", flush=True)
  rules = {rule: score(rows, rule) for rule in ("fires_probe_rule", "fires_ratio_1",
                                                 "fires_ratio_05")}
  print("missed / false alarms:", rules)
  check = diagnostics.VacuityCheck()
  return dict(task=("blobs 'overlapping' (make_blobs, raw features), 2000 train, the generator's "
                    "test split, cross-entropy, 4 epochs, eta 0.3, lr_min 1e-3, sound, float32, "
                    "interval bounds; base b=500, gamma=0.06, alpha=0.5, k=5 (6-32-2); each "
                    "row's change to the base in 'change'"),
              probe_rule=dict(min_certified=check.min_certified, n_probe=check.n_probe),
              columns=dict(max_width_ratio="largest leaf mean width / its layer's mean |w| "
                                           "after the last epoch",
                           probe_certified="certified fraction of the fit's training probe",
                           test_certified="certified fraction of the test set",
                           fires_probe_rule="fit warned (VacuityCheck defaults, no validation "
                                            "data)",
                           fires_ratio_1="width rule at 1 (the old warning)",
                           fires_ratio_05="width rule at 0.5"),
              score=dict(definition=f"missed: test_certified < {NOTHING} without a warning; "
                                    f"false_alarms: test_certified >= {MOST} with a warning",
                         **rules),
              rows=rows, provenance=record())


def main():
  argparse.ArgumentParser(description=__doc__.split("\n")[0]).parse_args()
  res = run()
  RESULTS.mkdir(exist_ok=True)
  (RESULTS / "agt_vacuity.json").write_text(json.dumps(res, indent=1))
  print("wrote", RESULTS / "agt_vacuity.json")


if __name__ == "__main__":
  main()
