"""Cost of bound propagation relative to the jitted forward pass (issue "boundjax core", item 9).

Networks: (a) MLP 784-1024-1024-10, batch 256; (b) MLP 14-50-50-2, batch 1024;
(c) CNN conv(16,k4,s2)-conv(32,k4,s1)-dense(100)-dense(10) on 28x28x1, batch 256.
Methods, all jitted, median wall time: forward, IBP, IBP with interval parameters, CROWN-IBP,
CROWN. Prints a table of times and ratios to the forward pass; writes
benchmarks/results/propagation.json.

    python benchmarks/propagation.py                 # all networks, all methods
    python benchmarks/propagation.py --nets b --skip-crown
"""

from __future__ import annotations

import argparse
import json
import pathlib
import platform
import statistics
import time

import flax.linen as nn
import jax
import jax.numpy as jnp

import boundjax as bj


class MLP(nn.Module):
  widths: tuple

  @nn.compact
  def __call__(self, x):
    for w in self.widths[:-1]:
      x = nn.relu(nn.Dense(w)(x))
    return nn.Dense(self.widths[-1])(x)


class CNN(nn.Module):
  @nn.compact
  def __call__(self, x):
    x = nn.relu(nn.Conv(16, (4, 4), strides=(2, 2), padding="VALID")(x))
    x = nn.relu(nn.Conv(32, (4, 4), strides=(1, 1), padding="VALID")(x))
    x = x.reshape(x.shape[0], -1)
    x = nn.relu(nn.Dense(100)(x))
    return nn.Dense(10)(x)


NETS = {
    "a": ("MLP 784-1024-1024-10, batch 256", lambda: MLP((1024, 1024, 10)), (256, 784)),
    "b": ("MLP 14-50-50-2, batch 1024", lambda: MLP((50, 50, 2)), (1024, 14)),
    "c": ("CNN conv16-conv32-100-10, batch 256", CNN, (256, 28, 28, 1)),
}


def _median_time(fn, *args, reps: int) -> float:
  jax.block_until_ready(fn(*args))  # compile
  times = []
  for _ in range(reps):
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - t0)
  return statistics.median(times)


def run(nets, reps: int, skip_crown: bool) -> list[dict]:
  rows = []
  for key in nets:
    title, make, shape = NETS[key]
    model = make()
    x = jax.random.uniform(jax.random.PRNGKey(0), shape)
    params = model.init(jax.random.PRNGKey(1), x)
    box = bj.Interval.around(x, 0.01, domain=(0.0, 1.0))
    pbox = jax.tree_util.tree_map(lambda w: bj.Interval.around(w, 1e-3), params)
    methods = {
        "forward": (jax.jit(model.apply), (params, x)),
        "ibp": (jax.jit(bj.ibp(model.apply)), (params, box)),
        "ibp_params": (jax.jit(bj.ibp(model.apply)), (pbox, box)),
    }
    if not skip_crown:
      methods["crown_ibp"] = (jax.jit(bj.crown(model.apply, intermediate="ibp")), (params, box))
      methods["crown"] = (jax.jit(bj.crown(model.apply)), (params, box))
    times = {}
    for name, (fn, args) in methods.items():
      times[name] = _median_time(fn, *args, reps=1 if name == "crown" else reps)
      print(f"  {key} {name:<10} {times[name]:.4f} s", flush=True)
    rows.append({"net": key, "title": title, "seconds": times,
                 "ratio_to_forward": {k: v / times["forward"] for k, v in times.items()}})
  return rows


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--nets", default="abc")
  parser.add_argument("--reps", type=int, default=5)
  parser.add_argument("--skip-crown", action="store_true")
  parser.add_argument("--out", default="benchmarks/results/propagation.json")
  args = parser.parse_args()
  rows = run(list(args.nets), args.reps, args.skip_crown)
  print(f"\n{'network':<38}" + "".join(f"{m:>14}" for m in rows[0]["seconds"]))
  for r in rows:
    print(f"{r['title']:<38}" + "".join(
        f"{r['seconds'][m]:8.4f}s {r['ratio_to_forward'][m]:4.1f}x" for m in r["seconds"]))
  out = {"device": jax.devices()[0].device_kind, "machine": platform.processor() or platform.machine(),
         "cpu_count": jax.local_device_count(), "rows": rows}
  pathlib.Path(args.out).parent.mkdir(parents=True, exist_ok=True)
  pathlib.Path(args.out).write_text(json.dumps(out, indent=2))
  print(f"wrote {args.out}")


if __name__ == "__main__":
  main()
