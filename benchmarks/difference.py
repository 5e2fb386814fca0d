"""Difference intervals on Adult 2×50 (LUCID, §5.4 and §6.2): how much tighter than subtracting
two IBP intervals, and how many hyper-network neurons are relax-if-similar candidates.

Setting (LUCID, §7 and App. B, scaled to one CPU): Adult (Sphynx encoding, 21 features, all 32,561
training rows), MLP 21-50-50-2, softmax cross-entropy, SGD lr 0.1 with weight decay 1e-5 (LUCID's
``train.py``), 10 epochs, batch 1024, the same initial parameters and data order for every
network. N and ``--members`` − 1 leave-one-out networks (points drawn uniformly from D) are trained
in one vmapped run (`boundjax.ensembles.train_ensemble`, checkpointed). The hyper-network N#_S is
the min/max over the leave-one-out networks of a set S (LUCID §2.3); the full set and random
subsets of ``--subsets`` sizes (the sets branch-and-bound splits into) are measured.

For every S, over the whole input domain x ∈ [0, 1]^21, per layer:

* mean width of the difference interval ``I_z`` (`milp.difference.difference_bounds`, float64,
  IBP bounds for N), pre- and post-ReLU;
* mean width of ``IBP(N#) − IBP(N)`` (`milp.difference.naive_difference`) and the ratio;
* the same widths from the jaxpr domain ``bj.difference`` (float64 via ``jax.enable_x64``) with
  both bilinear forms intersected, as a cross-check (it can only be tighter);
* the fraction of hidden neurons with post-ReLU difference width ≤ τ = 0.01 (relax-if-similar
  candidates, §2.7), among all and among those the hyper-network leaves unstable
  (``l# < 0 < u#``, the only ones RiS can relax);
* the same with CROWN bounds for N and N# (``method="crown"``): N's bounds enter the
  difference through ``z`` in ``I_w z#`` and the ReLU cases;
* an empirical check: members of S evaluated on sampled inputs lie inside the intervals.

Run:  JAX_PLATFORMS=cpu python benchmarks/difference.py [--members 200 --subsets 50 10]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import boundjax as bj
from boundjax import ensembles as E
from boundjax import hypernet as H
from boundjax.data.adult import load_adult
from boundjax.models import MLP, mlp_layer_values
from milp import difference as MD
from milp import network as MN
from common import RESULTS, record

CACHE = Path(os.environ.get("BOUNDJAX_CACHE", Path.home() / ".cache" / "boundjax"))
TAU = 0.01


def train(members: int, seed: int, chunk: int, epochs: int, ckpt: Path):
  data = load_adult(encoding="sphynx")
  model = MLP(hidden=(50, 50), out=2)
  init = model.init(jax.random.PRNGKey(seed), data.x_train[:1])
  n = data.x_train.shape[0]
  subset = np.random.default_rng(seed).choice(n, members - 1, replace=False)
  removed = E.leave_k_out(subset)
  t = time.perf_counter()
  ens = E.train_ensemble(model, init, E.sgd(0.1, weight_decay=1e-5), data.x_train, data.y_train,
                         removed, epochs=epochs, batch_size=1024, seed=seed, chunk_size=chunk,
                         checkpoint_dir=ckpt)
  return data, model, ens, time.perf_counter() - t


layers_fn = mlp_layer_values  # every pre- and post-activation value, in order


def empirical_check(net: MN.Network, members: list[MN.Network], db: MD.DifferenceBounds,
                    x: np.ndarray) -> int:
  """Asserts members' differences at ``x`` lie in the bounds; returns the (member, x) count."""
  def pres(n):
    h, out = x, []
    for m, l in enumerate(n.layers):
      z = h @ MN._dense(l.w_lower).T + l.b_lower
      out.append(z)
      h = np.maximum(z, 0)
    return out
  ref = pres(net)
  for mem in members:
    zs = pres(mem)
    for m, (z, r) in enumerate(zip(zs, ref)):
      lo, hi = db.pre[m]
      if np.any(z - r < lo - 1e-9) or np.any(z - r > hi + 1e-9):
        raise AssertionError(f"pre-ReLU difference outside its interval at layer {m}")
      if m < len(db.post):
        d = np.maximum(z, 0) - np.maximum(r, 0)
        lo, hi = db.post[m]
        if np.any(d < lo - 1e-9) or np.any(d > hi + 1e-9):
          raise AssertionError(f"post-ReLU difference outside its interval at layer {m}")
  return len(members) * x.shape[0]


def measure(net, hyper_params, full64, rows, members_all, d, rng) -> dict:
  hyper = MN.from_params(hyper_params)
  lo, hi = np.zeros(d), np.ones(d)
  t = time.perf_counter()
  db = MD.difference_bounds(net, hyper, lo, hi)
  milp_s = time.perf_counter() - t
  pre_n, post_n = MD.naive_difference(net, hyper, lo, hi)
  db_c = MD.difference_bounds(net, hyper, lo, hi, "crown")
  with jax.enable_x64(True):
    h64 = jax.tree_util.tree_map(
        lambda a: bj.Interval(jnp.asarray(np.asarray(a.lower, np.float64)),
                              jnp.asarray(np.asarray(a.upper, np.float64))), hyper_params,
        is_leaf=bj.is_interval)
    box = bj.Interval(jnp.zeros((1, d), jnp.float64), jnp.ones((1, d), jnp.float64))
    fn = jax.jit(bj.difference(layers_fn))
    jax.block_until_ready(fn(full64, h64, box))
    t = time.perf_counter()
    dom = jax.block_until_ready(fn(full64, h64, box))
    dom_s = time.perf_counter() - t
  layers = []
  n_layers = len(db.pre)
  for m in range(n_layers):
    row = dict(layer=m + 1, neurons=int(db.pre[m][0].size))
    w = db.pre[m][1] - db.pre[m][0]
    nw = pre_n[m][1] - pre_n[m][0]
    dw = np.asarray(dom[2 * m].delta.upper - dom[2 * m].delta.lower)[0]
    row.update(pre_width=float(w.mean()), pre_naive_width=float(nw.mean()),
               pre_ratio=float(w.mean() / nw.mean()), pre_domain_width=float(dw.mean()),
               pre_domain_over_milp=float(dw.mean() / w.mean()),
               pre_width_crown=float(np.mean(db_c.pre[m][1] - db_c.pre[m][0])))
    if m < n_layers - 1:
      w = db.post[m][1] - db.post[m][0]
      nw = post_n[m][1] - post_n[m][0]
      dw = np.asarray(dom[2 * m + 1].delta.upper - dom[2 * m + 1].delta.lower)[0]
      lh, uh = db.hyper[m]
      unstable = (lh < 0) & (uh > 0)
      small = w <= TAU
      row.update(post_width=float(w.mean()), post_naive_width=float(nw.mean()),
                 post_ratio=float(w.mean() / max(nw.mean(), 1e-300)),
                 post_domain_width=float(dw.mean()),
                 post_domain_over_milp=float(dw.mean() / max(w.mean(), 1e-300)),
                 similar_fraction=float(small.mean()),
                 post_width_crown=float(np.mean(db_c.post[m][1] - db_c.post[m][0])),
                 similar_fraction_crown=float(np.mean(db_c.post[m][1] - db_c.post[m][0] <= TAU)),
                 unstable_hyper=int(unstable.sum()),
                 similar_among_unstable=int((small & unstable).sum()),
                 similar_fraction_unstable=float((small & unstable).sum() / max(unstable.sum(), 1)))
    layers.append(row)
  x = rng.random((200, d))
  x[:50] = np.round(x[:50])
  checked = empirical_check(net, [members_all[i] for i in rows], db, x)
  return dict(size=len(rows), layers=layers, milp_seconds=milp_s, domain_seconds=dom_s,
              checked_pairs=checked)


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--members", type=int, default=200, help="networks trained (N included)")
  ap.add_argument("--subsets", type=int, nargs="*", default=[50, 10],
                  help="sizes of random subsets S of the leave-one-out networks")
  ap.add_argument("--seed", type=int, default=0)
  ap.add_argument("--chunk", type=int, default=16)
  ap.add_argument("--epochs", type=int, default=10)
  ap.add_argument("--ckpt", default=str(CACHE / "ckpt_adult_2x50_lucid_difference"))
  ap.add_argument("--out", default=str(RESULTS / "difference_adult_2x50.json"))
  args = ap.parse_args(argv)

  data, model, ens, train_s = train(args.members, args.seed, args.chunk, args.epochs,
                                    Path(args.ckpt))
  d = data.x_train.shape[1]
  host = jax.tree_util.tree_map(np.asarray, ens.params)
  full = jax.tree_util.tree_map(lambda a: a[0], host)
  net = MN.from_params(full)
  members_all = MN.stack_members(host)
  acc = float(np.mean(np.argmax(model.apply(ens.full, data.x_test), -1) == data.y_test))
  with jax.enable_x64(True):
    full64 = jax.tree_util.tree_map(lambda a: jnp.asarray(np.asarray(a, np.float64)), full)
  rng = np.random.default_rng(args.seed)
  loo = np.arange(1, ens.n_members)
  sets = {"all": loo}
  for s in args.subsets:
    if s < loo.size:
      sets[f"random_{s}"] = np.sort(rng.choice(loo, s, replace=False))
  results = {}
  for name, rows in sets.items():
    results[name] = measure(net, H.from_ensemble(host, rows), full64, rows, members_all, d, rng)

  out = dict(
      provenance=record(),
      setting=dict(dataset="adult (sphynx encoding, 21 features)", model="MLP 21-50-50-2",
                   loss="softmax cross-entropy", optimizer="SGD lr 0.1, weight decay 1e-5",
                   epochs=args.epochs, batch_size=1024, seed=args.seed, members=args.members,
                   input_box="[0,1]^21", tau=TAU, bounds_for_N="ibp"),
      n_test_accuracy=acc, training_seconds=train_s, devices=str(jax.devices()),
      sets=results,
      notes="width = mean over the layer's neurons of (upper - lower); naive = IBP(N#) - IBP(N); "
            "training_seconds counts checkpointed chunks as loaded, not retrained. "
            "ratio = width / naive width. domain = bj.difference (float64, both bilinear forms). "
            "similar = post-ReLU difference width <= tau (RiS candidates); RiS only relaxes "
            "neurons the hyper-network leaves unstable.")
  RESULTS.mkdir(parents=True, exist_ok=True)
  Path(args.out).write_text(json.dumps(out, indent=1))

  print(f"\nAdult 2×50: N test accuracy {acc:.4f}; {args.members} networks trained in "
        f"{train_s:.0f} s; input box [0,1]^{d}; tau = {TAU}")
  hdr = (f"{'S':<15}{'layer':>6}{'pre width':>11}{'IBP diff':>10}{'ratio':>8}{'domain':>10}"
         f"{'post width':>12}{'IBP diff':>10}{'ratio':>8}{'<= tau':>8}{'unst.':>7}{'<=tau|unst':>11}")
  print(hdr)
  for name, r in results.items():
    for row in r["layers"]:
      line = (f"{name + ' (' + str(r['size']) + ')':<15}{row['layer']:>6}{row['pre_width']:>11.4f}"
              f"{row['pre_naive_width']:>10.3f}{row['pre_ratio']:>8.3f}"
              f"{row['pre_domain_width']:>10.4f}")
      if "post_width" in row:
        line += (f"{row['post_width']:>12.4f}{row['post_naive_width']:>10.3f}"
                 f"{row['post_ratio']:>8.3f}{row['similar_fraction']:>8.2f}"
                 f"{row['unstable_hyper']:>7d}{row['similar_fraction_unstable']:>11.2f}")
      print(line)
  for name, r in results.items():
    print(f"  with CROWN bounds, {name}: pre width "
          + ", ".join(f"{row['pre_width_crown']:.4f}" for row in r["layers"])
          + "; post width " + ", ".join(f"{row['post_width_crown']:.4f}" for row in r["layers"]
                                        if "post_width_crown" in row)
          + "; <= tau " + ", ".join(f"{row['similar_fraction_crown']:.2f}" for row in r["layers"]
                                    if "similar_fraction_crown" in row))
  dom = [row[k] for r in results.values() for row in r["layers"]
         for k in ("pre_domain_over_milp", "post_domain_over_milp") if k in row]
  print(f"bj.difference / milp.difference mean width: {min(dom):.4f} .. {max(dom):.4f}; "
        f"time per bound (milp, jitted domain): "
        f"{results['all']['milp_seconds'] * 1e3:.1f} ms, {results['all']['domain_seconds'] * 1e3:.1f} ms")
  print(f"every (member, x) pair checked inside: "
        f"{sum(r['checked_pairs'] for r in results.values())} pairs")
  print(f"wrote {args.out}")


if __name__ == "__main__":
  main()
