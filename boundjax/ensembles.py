"""Leave-k-out ensembles: the network N trained on D and networks trained on D minus k points,
all in one jitted, vmapped run.

LUCID (§2, §5.2) and Sphynx (§5.1) reason about the family
``{T(D)} ∪ {T(D \\ S) : S removed}``, where the training algorithm T is deterministic: every
member starts from the same initial parameters and sees the same shuffled batches. A removed
point is *masked* out of its batch, as LUCID's public ``train.py`` does:
for a batch ``b`` of indices and member weights ``w_i ∈ {0, 1}``,

    loss_b(θ) = Σ_{i∈b} w_i ℓ(θ; x_i, y_i) / max(Σ_{i∈b} w_i, 1).

So every member has the same batch boundaries and all of them train in one program:
``jax.vmap`` over the removed-index rows, ``jax.lax.scan`` over the SGD steps, ``jax.jit``
around both, members chunked to bound memory (tqdm bar over chunks, finished chunks checkpointed
to ``.npz`` and skipped on resume), and the member axis sharded over devices with
``jax.sharding`` when several exist. With ``workers > 1`` the chunks are trained by worker
processes, locally or on a Ray cluster (`boundjax.executor`), and collected in the checkpoint.

Decisions where the papers are silent (recorded here and in the tests):

* Shuffling: the data order is a `boundjax.training.Schedule` (default ``shuffle="epoch"``,
  ``last_batch="keep"``): epoch ``e`` uses ``jax.random.permutation(fold_in(PRNGKey(seed), e),
  n)``; batches are consecutive slices of it, the last one smaller (PyTorch ``drop_last=False``).
  With ``shuffle=False`` the order is ``0..n-1`` every epoch. The ensemble records its schedule
  (`Ensemble.schedule`): pass it to `boundjax.agt.fit` for a box that encloses the family.
* The SGD loop is `boundjax.training.train` with `boundjax.training.mean_gradient`; the
  optimizers (`sgd`, `l1_regularization`), losses and `masked_mean` live in `boundjax.training`
  and are re-exported here.
* A batch whose every point is removed (only possible when k >= its size) contributes a zero data
  gradient, but the optimizer step is still taken (weight decay / L1 still apply): the step count
  is the same for every member.
* L1 regularisation (Sphynx, coefficient 1e-5) is `l1_regularization`, an optax transform adding
  ``coef * sign(θ)`` to the gradient of every parameter, biases included (Sphynx, §6, does
  not say). LUCID's weight decay is ``optax.add_decayed_weights(wd)`` before ``optax.sgd(lr)``,
  which is exactly ``torch.optim.SGD(weight_decay=wd)``.
* Precision: float32 (the papers train in PyTorch float32); pass float64 data and parameters with
  ``jax_enable_x64`` for a float64 run.
* Determinism: same settings give bit-identical parameters on CPU (tested). On GPU set
  ``XLA_FLAGS=--xla_gpu_deterministic_ops=true``. A vmapped member and the same
  network trained alone (`train_single`) agree to float32 rounding, not bit for bit: XLA may order
  a batched matmul's sums differently. Over long runs with L1 the gap grows (Adult 2×50, 10
  epochs: ~1e-4), because a parameter that rounding moves across zero flips its subgradient
  ``coef * sign(w)``; in float64 the gap stays ~1e-16 (tested on Adult).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import pickle
import time
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from boundjax import training
from boundjax.core import options
from boundjax.executor import check_executor, run_jobs
from boundjax.training import (OptimizerLike, Schedule, as_schedule, batch_weights,
                               binary_logistic_loss, build_optimizer, l1_regularization,
                               masked_mean, sgd, softmax_cross_entropy)

PyTree = Any
ApplyFn = Callable[[PyTree, jax.Array], jax.Array]
LossFn = Callable[[jax.Array, jax.Array], jax.Array]

__all__ = [
    "Ensemble",
    "Schedule",
    "leave_k_out",
    "l1_regularization",
    "sgd",
    "softmax_cross_entropy",
    "binary_logistic_loss",
    "epoch_orders",
    "batch_schedule",
    "batch_weights",
    "masked_mean",
    "train_single",
    "train_ensemble",
]


# ---------------------------------------------------------------------------------------------
# Removal sets
# ---------------------------------------------------------------------------------------------

def leave_k_out(indices: Any, k: int = 1, include_full: bool = True) -> np.ndarray:
  """Removed-index rows for `train_ensemble`: shape ``(members, k)``, ``-1`` meaning "none".

  Args:
    indices: ``(m,)`` point indices (one member each, ``k == 1``) or ``(m, k)`` rows of them
      (integers; ``-1`` for "none" in a row of fewer than k removals).
    k: points removed per member, an integer >= 1.
    include_full: prepend a row of ``-1`` (row 0 = the network N trained on all of D).

  Raises `boundjax.core.options.OptionError` for ``k < 1`` or a non-integer index (``1.7``
  would otherwise be truncated to another point).
  """
  k = options.integer("k", k, minimum=1)
  idx = options.index_array("indices", indices, minimum=-1)
  if idx.ndim == 1:
    if k != 1:
      if idx.size % k:
        raise ValueError(f"leave_k_out: {idx.size} indices cannot be cut into rows of k={k}.")
      idx = idx.reshape(-1, k)
    else:
      idx = idx[:, None]
  if idx.ndim != 2 or idx.shape[1] != k:
    raise ValueError(f"leave_k_out: expected indices of shape (m,) or (m, {k}), got {idx.shape}.")
  if include_full:
    idx = np.concatenate([np.full((1, k), -1, np.int64), idx], axis=0)
  return idx.astype(np.int32)


# ---------------------------------------------------------------------------------------------
# Data order (kept for callers of the old functions; the order is `boundjax.training.Schedule`)
# ---------------------------------------------------------------------------------------------

def epoch_orders(seed: int, n: int, epochs: int, shuffle: bool = True) -> np.ndarray:
  """Visiting order of the n points in every epoch, shape ``(epochs, n)``: a copy of
  ``Schedule(n, 1, epochs, seed, "epoch" if shuffle else "none").orders_np()``."""
  n = options.integer("n", n, minimum=1)
  epochs = options.integer("epochs", epochs, minimum=1)
  return Schedule(n=n, batch_size=1, epochs=epochs, seed=seed,
                  shuffle="epoch" if shuffle else "none").orders_np().copy()


def batch_schedule(seed: int, n: int, epochs: int, batch_size: int,
                   shuffle: bool = True) -> np.ndarray:
  """Index batches of every SGD step, shape ``(epochs * ceil(n / B), B)``, padded with ``-1``:
  ``Schedule(n, batch_size, epochs, seed, "epoch" if shuffle else "none").batches_np()``."""
  batch_size = options.integer("batch_size", batch_size, minimum=1)
  return Schedule(n=n, batch_size=batch_size, epochs=epochs, seed=seed,
                  shuffle="epoch" if shuffle else "none").batches_np()


# ---------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------

def _apply_fn(model: Any) -> ApplyFn:
  if hasattr(model, "apply") and callable(model.apply):
    return model.apply
  if callable(model):
    return model
  raise ValueError(f"model must be a Flax module or an apply function, got {type(model)!r}.")


def _check_data(model: Any, init_params: PyTree, x: Any, y: Any, loss_fn: LossFn,
                removed: Optional[np.ndarray] = None) -> tuple[int, np.ndarray]:
  """The number of points and the removed rows, after the checks of `boundjax.core.options`:
  ``x`` finite (a NaN input would make every member's parameters NaN), labels that the loss
  takes (classes ``0 .. C - 1`` for `softmax_cross_entropy` on ``C`` logits, whose one-hot of
  another label is all zeros; -1, 0 or 1 for `binary_logistic_loss`; finite for any other
  loss), removed indices integers in ``[-1, n - 1]``."""
  n = int(np.shape(x)[0])
  if np.shape(y)[0] != n:
    raise ValueError(f"x has {n} rows but y has {np.shape(y)[0]}.")
  options.finite_array("x", x)
  if loss_fn is softmax_cross_entropy:
    out = jax.eval_shape(_apply_fn(model), init_params, jnp.asarray(x[:1]))
    options.class_labels("y", y, out.shape[-1] if out.ndim > 1 else 1)
  elif loss_fn is binary_logistic_loss:
    options.labels_in("y", y, (-1, 0, 1), "binary_logistic_loss")
  else:
    options.finite_array("y", y)
  if removed is None:
    return n, np.zeros((0, 0), np.int32)
  removed = np.asarray(removed)
  if removed.ndim == 1:
    removed = removed[:, None]
  if removed.ndim != 2:
    raise ValueError(f"removed must have shape (members, k), got {removed.shape}.")
  removed = options.index_array("removed", removed, minimum=-1, maximum=n - 1)
  return n, removed.astype(np.int32)


def train_single(model: Any, init_params: PyTree, optimizer: OptimizerLike,
                 x: Any, y: Any, removed_row: Optional[Sequence[int]] = None, *,
                 epochs: Optional[int] = None, batch_size: Optional[int] = None, seed: int = 0,
                 shuffle: bool = True, loss_fn: LossFn = softmax_cross_entropy,
                 schedule: Optional[Schedule] = None) -> PyTree:
  """One network trained alone (jitted scan) with the points of ``removed_row`` masked out.

  Same schedule and arithmetic as one row of `train_ensemble`; it is the baseline the benchmark
  loops over. ``removed_row=None`` trains N on all of D. Give ``schedule`` or ``epochs``,
  ``batch_size`` (and ``seed``, ``shuffle``). ``removed_row`` holds integer row indices in
  ``[-1, n - 1]`` (``-1``: none); data and labels are checked as in `train_ensemble`.
  """
  n, _ = _check_data(model, init_params, x, y, loss_fn)
  sched = as_schedule(schedule, n, epochs=epochs, batch_size=batch_size, seed=seed,
                      shuffle=shuffle, who="train_single")
  row = options.index_array("removed_row", [] if removed_row is None else removed_row,
                            minimum=-1, maximum=n - 1).astype(np.int32).reshape(-1)
  fn = _jitted_single(_apply_fn(model), build_optimizer(optimizer), loss_fn)
  return fn(init_params, jnp.asarray(row), jnp.asarray(x), jnp.asarray(y), sched.batches())


def _member(apply_fn, optimizer, loss_fn, params, removed_row, x, y, batches):
  """One member: `boundjax.training.train` on the masked mean loss."""
  return training.train(training.mean_gradient(apply_fn, loss_fn), optimizer, params, x, y,
                        batches, removed_row=removed_row)


# Compiled trainers, keyed by (apply_fn, optimizer, loss_fn). Bounded: every `sgd(...)` call makes
# a new optimizer object, and each entry keeps its compiled programs alive.
@functools.lru_cache(maxsize=16)
def _jitted_single(apply_fn, optimizer, loss_fn):
  return jax.jit(functools.partial(_member, apply_fn, optimizer, loss_fn))


@functools.lru_cache(maxsize=16)
def _jitted_vmapped(apply_fn, optimizer, loss_fn):
  one = functools.partial(_member, apply_fn, optimizer, loss_fn)
  return jax.jit(jax.vmap(one, in_axes=(None, 0, None, None, None)))


# ---------------------------------------------------------------------------------------------
# The ensemble container and .npz I/O
# ---------------------------------------------------------------------------------------------

def _path_name(path) -> str:
  parts = []
  for k in path:
    if isinstance(k, jax.tree_util.DictKey):
      parts.append(str(k.key))
    elif isinstance(k, jax.tree_util.SequenceKey):
      parts.append(f"#{k.idx}")
    elif isinstance(k, jax.tree_util.GetAttrKey):
      parts.append(str(k.name))
    else:
      parts.append(str(k))
  return "/".join(parts)


def _flatten_named(tree: PyTree) -> dict[str, np.ndarray]:
  leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
  return {"param:" + _path_name(p): np.asarray(v) for p, v in leaves}


def _unflatten_named(arrays: dict[str, np.ndarray], like: Optional[PyTree]) -> PyTree:
  names = [k for k in arrays if k.startswith("param:")]
  if like is not None:
    want = list(_flatten_named(like))
    missing = [w for w in want if w not in arrays]
    if missing:
      raise ValueError(f"checkpoint lacks parameters {missing[:3]} of the template.")
    treedef = jax.tree_util.tree_structure(like)
    return jax.tree_util.tree_unflatten(treedef, [arrays[w] for w in want])
  out: dict = {}
  for name in names:
    parts = name[len("param:"):].split("/")
    if any(p.startswith("#") for p in parts):
      raise ValueError("parameters with list/tuple nodes need a `like=` template to load.")
    node = out
    for p in parts[:-1]:
      node = node.setdefault(p, {})
    node[parts[-1]] = arrays[name]
  return out


@dataclasses.dataclass
class Ensemble:
  """Stacked parameters of a leave-k-out family.

  Attributes:
    params: the model's parameter pytree with a leading member axis of size ``M``.
    removed: ``(M, k)`` int array of the indices each member left out (``-1`` = none); row 0 is
      N (no removal) when the ensemble came from ``leave_k_out(..., include_full=True)``.
    schedule: the `boundjax.training.Schedule` every member followed (None when loaded from a
      file: `save` does not store it).
  """

  params: PyTree
  removed: np.ndarray
  schedule: Optional[Schedule] = None

  @property
  def n_members(self) -> int:
    return int(self.removed.shape[0])

  def member(self, i: int) -> PyTree:
    """Parameters of member ``i`` (no leading axis)."""
    return jax.tree_util.tree_map(lambda a: a[i], self.params)

  @property
  def full(self) -> PyTree:
    """N, the member that removed nothing; raises if there is none."""
    rows = np.flatnonzero(np.all(self.removed < 0, axis=1))
    if not rows.size:
      raise ValueError("this ensemble has no member trained on all of D (a row of -1).")
    return self.member(int(rows[0]))

  def flat(self) -> np.ndarray:
    """``(M, P)`` matrix of all parameters, leaves in pytree order."""
    leaves = jax.tree_util.tree_leaves(self.params)
    return np.concatenate([np.asarray(l).reshape(self.n_members, -1) for l in leaves], axis=1)

  def select(self, rows: Any) -> "Ensemble":
    rows = np.asarray(rows)
    return Ensemble(jax.tree_util.tree_map(lambda a: np.asarray(a)[rows], self.params),
                    self.removed[rows], self.schedule)

  def save(self, path: str | os.PathLike) -> None:
    """Writes ``removed`` and every parameter leaf (named by its pytree path) to ``path``."""
    arrays = _flatten_named(self.params)
    arrays["removed"] = np.asarray(self.removed)
    _atomic_savez(Path(path), arrays)

  @classmethod
  def load(cls, path: str | os.PathLike, like: Optional[PyTree] = None) -> "Ensemble":
    """Reads an `Ensemble.save` file; nested dicts are rebuilt, other trees need ``like``."""
    with np.load(path) as f:
      arrays = {k: f[k] for k in f.files}
    if "removed" not in arrays:
      raise ValueError(f"{path}: not an ensemble file (no 'removed' array).")
    return cls(_unflatten_named(arrays, like), arrays["removed"])


def _atomic_savez(path: Path, arrays: dict[str, np.ndarray]) -> None:
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.with_name(path.name + ".tmp.npz")
  np.savez(tmp, **arrays)
  os.replace(tmp, path)


def _fingerprint(tree: PyTree) -> str:
  h = hashlib.sha256()
  for leaf in jax.tree_util.tree_leaves(tree):
    a = np.ascontiguousarray(np.asarray(leaf))
    h.update(str(a.shape).encode() + str(a.dtype).encode() + a.tobytes())
  return h.hexdigest()[:16]


def _member_sharding(n_dev: int):
  from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
  mesh = Mesh(np.array(jax.devices()[:n_dev]), ("members",))
  return NamedSharding(mesh, P("members")), NamedSharding(mesh, P())


def train_ensemble(model: Any, init_params: PyTree, optimizer: OptimizerLike,
                   x: Any, y: Any, removed: Any, *, epochs: Optional[int] = None,
                   batch_size: Optional[int] = None, seed: int = 0, shuffle: bool = True,
                   loss_fn: LossFn = softmax_cross_entropy, chunk_size: int = 512,
                   checkpoint_dir: Optional[str | os.PathLike] = None,
                   progress: bool = True, shard: Optional[bool] = None,
                   chunk_ids: Optional[Sequence[int]] = None,
                   schedule: Optional[Schedule] = None, workers: int = 1,
                   executor: str = "process", address: Optional[str] = None) -> Ensemble:
  """Trains every member of a leave-k-out family in one jitted, vmapped program per chunk.

  Member ``m`` runs SGD from ``init_params`` over the shared `Schedule` with the masked
  batch loss ``Σ w_i ℓ_i / max(Σ w_i, 1)`` where ``w_i = 0`` for ``i ∈ removed[m]``
  (LUCID, §2 and §7; the mask is that of LUCID's public ``train.py``).

  Args:
    model: a Flax linen module (its ``apply`` is used) or a function ``apply(params, x)``.
    init_params: the initial parameters shared by every member (e.g. ``module.init(key, x)``).
    optimizer: an optax transformation, e.g. ``sgd(0.1, weight_decay=1e-5)`` or ``sgd(0.1,
      l1=1e-5)``, or a zero-argument factory of one (`boundjax.training.OptimizerLike`), e.g.
      ``functools.partial(sgd, 0.1, weight_decay=1e-5)``; ``workers > 1`` needs the factory
      (it pickles, the transformation does not).
    x, y: the whole training set D (rows are points).
    removed: ``(M, k)`` int indices per member, ``-1`` for none (see `leave_k_out`).
    schedule: the data order (`boundjax.training.Schedule`), identical for all members; or
      give epochs, batch_size, seed, shuffle (``Schedule(n, batch_size, epochs, seed,
      "epoch" if shuffle else "none")``).
    loss_fn: per-example loss ``(logits, labels) -> (B,)``.
    chunk_size: members per compiled program; the last chunk is padded (with N) to this size,
      and rounded up to a multiple of the device count when sharding.
    checkpoint_dir: if given, each finished chunk is written there and chunks already present
      (from an interrupted run with the same settings) are loaded instead of retrained.
    progress: show a tqdm bar over members (with ``workers > 1``: the first worker's).
    shard: put the member axis on a ``NamedSharding`` over all devices (default: when
      ``jax.device_count() > 1`` and ``workers == 1``).
    chunk_ids: train (or load) only these chunks, ``0 <= id < ceil(M / chunk_size)``; needs
      ``checkpoint_dir``. Several processes given disjoint ids fill one checkpoint in parallel;
      a last call without ``chunk_ids`` then loads them all. ``workers`` does this for you.
    workers: with ``workers > 1`` (needs ``checkpoint_dir``) the chunks not yet in the
      checkpoint are dealt round-robin to ``workers`` jobs of `boundjax.executor.run_jobs`;
      each trains its chunks into the checkpoint in a worker process with single-threaded XLA
      (on a CPU, one such process per core trains ~1.4x more networks per second than one
      multi-threaded process), then this call loads the family. The members are those of the
      serial run, bit for bit on a CPU (tested).
    executor: how the jobs run: ``"process"`` (a pool of spawned local processes), ``"ray"``
      (a local Ray instance of ``workers`` CPUs, or the cluster at ``address``) or
      ``"serial"`` (one after the other in this process, for debugging).
    address: a Ray cluster address (implies ``executor="ray"``); ``checkpoint_dir`` must then
      be on a file system every node sees.

  Returns:
    `Ensemble` with ``params`` stacked along a leading member axis (row order = ``removed``;
    with ``chunk_ids``, the rows of those chunks in that order) and the schedule.

  Raises `boundjax.core.options.OptionError` before any training when ``x`` holds NaN or ±inf,
  a label is not one the loss takes (a class of the network's logits for
  `softmax_cross_entropy`), a removed index is not an integer in ``[-1, n - 1]``, or a count
  (``chunk_size``, ``workers``, ``chunk_ids``) is not an integer in range.
  """
  n, removed = _check_data(model, init_params, x, y, loss_fn, removed)
  if removed.shape[0] == 0:
    raise ValueError("removed has no rows: nothing to train.")
  sched = as_schedule(schedule, n, epochs=epochs, batch_size=batch_size, seed=seed,
                      shuffle=shuffle, who="train_ensemble")
  parallel = _wants_workers(workers, executor, address, checkpoint_dir, shard)
  chunks = _chunking(removed.shape[0], chunk_size, False if parallel else shard)
  ids = _selected_chunks(chunks, chunk_ids, checkpoint_dir)
  ckpt = Path(checkpoint_dir) if checkpoint_dir is not None else None
  if ckpt is not None:
    _check_meta(ckpt, _meta(n, removed, sched, chunks, init_params, x, y))
  if parallel:
    job = _ChunkJob(model=model, init_params=jax.tree_util.tree_map(np.asarray, init_params),
                    optimizer=optimizer, x=np.asarray(x), y=np.asarray(y), removed=removed,
                    schedule=sched, loss_fn=loss_fn, chunk_size=chunks.size,
                    checkpoint_dir=str(ckpt), progress=progress)
    _train_in_workers(job, [c for c in ids if not _chunk_file(ckpt, c).exists()], workers,
                      executor, address)
  return _train_chunks(model, init_params, optimizer, x, y, removed, sched, loss_fn, chunks,
                       ids, ckpt, progress)


@dataclasses.dataclass(frozen=True)
class _Chunking:
  """How the members are cut into compiled programs: ``count`` chunks of ``size`` rows."""
  size: int
  count: int
  shard: bool

  def rows(self, removed: np.ndarray, c: int) -> np.ndarray:
    return removed[c * self.size:(c + 1) * self.size]


def _chunking(n_members: int, chunk_size: int, shard: Optional[bool]) -> _Chunking:
  """Chunks of ``chunk_size`` members (at most all of them), a multiple of the device count
  when the member axis is sharded."""
  chunk_size = options.integer("chunk_size", chunk_size, minimum=1)
  n_dev = jax.device_count()
  shard = (n_dev > 1) if shard is None else bool(shard)
  step = n_dev if shard else 1
  size = min(-(-chunk_size // step) * step, -(-n_members // step) * step)
  return _Chunking(size, -(-n_members // size), shard)


def _selected_chunks(chunks: _Chunking, chunk_ids: Optional[Sequence[int]],
                     checkpoint_dir: Any) -> list[int]:
  if chunk_ids is None:
    return list(range(chunks.count))
  if checkpoint_dir is None:
    raise ValueError("chunk_ids needs checkpoint_dir (the chunks are collected there).")
  ids = [options.integer(f"chunk_ids[{i}]", c, minimum=0, maximum=chunks.count - 1)
         for i, c in enumerate(chunk_ids)]
  if not ids:
    raise ValueError(f"chunk_ids must be a non-empty list of ids in [0, {chunks.count}), got "
                     f"{list(chunk_ids)[:5]}.")
  return ids


def _meta(n: int, removed: np.ndarray, sched: Schedule, chunks: _Chunking, init_params: PyTree,
          x: Any, y: Any) -> dict:
  """The settings a checkpoint was written with (a resumed run must have the same)."""
  data = np.asarray(x).tobytes() + np.asarray(y).tobytes()
  return dict(n=n, k=int(removed.shape[1]), epochs=sched.epochs, batch_size=sched.batch_size,
              seed=sched.seed, shuffle=_meta_shuffle(sched), chunk_size=chunks.size,
              n_members=int(removed.shape[0]),
              removed=hashlib.sha256(removed.tobytes()).hexdigest()[:16],
              init_params=_fingerprint(init_params),
              data=hashlib.sha256(data).hexdigest()[:16])


def _train_chunks(model: Any, init_params: PyTree, optimizer: OptimizerLike, x: Any, y: Any,
                  removed: np.ndarray, sched: Schedule, loss_fn: LossFn, chunks: _Chunking,
                  ids: Sequence[int], ckpt: Optional[Path], progress: bool) -> Ensemble:
  """The chunks ``ids`` of the family, loaded from ``ckpt`` or trained (and saved) here."""
  bar = None
  if progress:
    from tqdm.auto import tqdm
    bar = tqdm(total=sum(chunks.rows(removed, c).shape[0] for c in ids),
               desc="leave-out members", unit="net")
  train = None
  parts = []
  t0 = time.perf_counter()
  for c in ids:
    rows = chunks.rows(removed, c)
    leaves = _load_chunk(ckpt, c, rows) if ckpt is not None else None
    if leaves is None:
      if train is None:     # compiled on the first chunk that is not in the checkpoint
        train = _chunk_trainer(model, init_params, optimizer, x, y, sched, loss_fn, chunks)
      leaves = train(rows)
      if ckpt is not None:
        _save_chunk(ckpt, c, rows, leaves)
    parts.append(leaves)
    if bar is not None:
      bar.update(rows.shape[0])
      bar.set_postfix(nets_per_s=f"{bar.n / max(time.perf_counter() - t0, 1e-9):.1f}")
  if bar is not None:
    bar.close()
  stacked = [np.concatenate(leaf, axis=0) for leaf in zip(*parts)]
  treedef = jax.tree_util.tree_structure(init_params)
  rows = np.concatenate([chunks.rows(removed, c) for c in ids])
  return Ensemble(jax.tree_util.tree_unflatten(treedef, stacked), rows, sched)


def _chunk_trainer(model: Any, init_params: PyTree, optimizer: OptimizerLike, x: Any, y: Any,
                   sched: Schedule, loss_fn: LossFn, chunks: _Chunking
                   ) -> Callable[[np.ndarray], list[np.ndarray]]:
  """``train(rows) -> leaves``: the members of one chunk (padded with N to ``chunks.size``),
  as numpy leaves with a leading member axis."""
  fn = _jitted_vmapped(_apply_fn(model), build_optimizer(optimizer), loss_fn)
  batches, xs, ys = sched.batches(), jnp.asarray(x), jnp.asarray(y)
  member_sh = None
  if chunks.shard:
    member_sh, repl = _member_sharding(jax.device_count())
    xs, ys, batches = (jax.device_put(a, repl) for a in (xs, ys, batches))
    init_params = jax.device_put(init_params, repl)

  def train(rows: np.ndarray) -> list[np.ndarray]:
    pad = np.full((chunks.size - rows.shape[0], rows.shape[1]), -1, np.int32)
    block = jnp.asarray(np.concatenate([rows, pad]))
    if member_sh is not None:
      block = jax.device_put(block, member_sh)
    out = fn(init_params, block, xs, ys, batches)
    return [np.asarray(leaf)[:rows.shape[0]] for leaf in jax.tree_util.tree_leaves(out)]
  return train


# ---------------------------------------------------------------------------------------------
# Chunks trained by worker processes (`boundjax.executor`)
# ---------------------------------------------------------------------------------------------

#: XLA flags of a single-threaded CPU worker.
_SINGLE_THREAD_XLA_FLAGS = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"

#: JAX settings that change the trained numbers (dtype, the shuffling permutations); a worker
#: takes them from the process that sent the job.
_JAX_SETTINGS = ("jax_enable_x64", "jax_default_prng_impl", "jax_threefry_partitionable")


def _jax_settings() -> tuple[tuple[str, Any], ...]:
  return tuple((name, getattr(jax.config, name)) for name in _JAX_SETTINGS
               if hasattr(jax.config, name))


@dataclasses.dataclass(frozen=True)
class _ChunkJob:
  """One worker's share of a family: train ``chunk_ids`` into ``checkpoint_dir``. Picklable
  when its model, optimizer (factory) and loss are; the arrays are numpy."""
  model: Any
  init_params: PyTree
  optimizer: OptimizerLike
  x: np.ndarray
  y: np.ndarray
  removed: np.ndarray
  schedule: Schedule
  loss_fn: LossFn
  chunk_size: int
  checkpoint_dir: str
  progress: bool
  chunk_ids: tuple[int, ...] = ()
  single_thread: bool = False
  jax_settings: tuple[tuple[str, Any], ...] = dataclasses.field(default_factory=_jax_settings)


def _train_job(job: _ChunkJob) -> int:
  """A worker's entry point: trains the job's chunks into the checkpoint; returns their count."""
  if job.single_thread:
    _single_threaded_xla()
  for name, value in job.jax_settings:
    jax.config.update(name, value)
  train_ensemble(job.model, job.init_params, job.optimizer, job.x, job.y, job.removed,
                 schedule=job.schedule, loss_fn=job.loss_fn, chunk_size=job.chunk_size,
                 checkpoint_dir=job.checkpoint_dir, chunk_ids=job.chunk_ids,
                 progress=job.progress, shard=False)
  return len(job.chunk_ids)


def _single_threaded_xla() -> None:
  """Asks for a single-threaded XLA CPU backend; effective when this process has not used JAX
  yet (a fresh worker: the flags are read when the backend starts)."""
  flags = os.environ.get("XLA_FLAGS", "")
  if "xla_cpu_multi_thread_eigen" not in flags:
    os.environ["XLA_FLAGS"] = f"{flags} {_SINGLE_THREAD_XLA_FLAGS}".strip()


def _wants_workers(workers: int, executor: str, address: Optional[str], checkpoint_dir: Any,
                   shard: Optional[bool]) -> bool:
  """True when the chunks go to worker processes; checks the options that come with it."""
  workers = options.integer("workers", workers, minimum=1)
  check_executor(executor, address)
  if workers == 1:
    if address is not None:
      raise ValueError("address (a Ray cluster) is used only with workers > 1.")
    return False
  if checkpoint_dir is None:
    raise ValueError("workers > 1 needs checkpoint_dir: the workers write their chunks there "
                     "and this call loads them.")
  if shard:
    raise ValueError("shard=True and workers > 1 exclude each other: each worker trains its "
                     "chunks on one device.")
  return True


def _train_in_workers(job: _ChunkJob, todo: list[int], workers: int, executor: str,
                      address: Optional[str]) -> None:
  """Deals the chunks ``todo`` round-robin to ``workers`` jobs and runs them."""
  if not todo:
    return
  kind = check_executor(executor, address)
  if kind != "serial":
    _check_picklable(job)
  jobs = [dataclasses.replace(job, chunk_ids=tuple(todo[i::workers]),
                              progress=job.progress and i == 0, single_thread=kind != "serial")
          for i in range(min(workers, len(todo)))]
  run_jobs(_train_job, jobs, executor=kind, workers=workers, address=address)


_PICKLE_FIXES = {
    "optimizer": "An optax transformation is made of closures: pass a factory of it instead, "
                 "e.g. functools.partial(boundjax.training.sgd, 0.1, weight_decay=1e-5).",
    "model": "Pass a Flax module or a module-level apply function.",
    "loss_fn": "Pass a module-level function, e.g. boundjax.training.softmax_cross_entropy.",
}


def _check_picklable(job: _ChunkJob) -> None:
  """Raises a ValueError naming the fix when the model, optimizer or loss does not pickle."""
  for name, fix in _PICKLE_FIXES.items():
    value = getattr(job, name)
    try:
      pickle.dumps(value)
    except Exception as e:  # noqa: BLE001 - pickle raises several types
      raise ValueError(f"train_ensemble(workers > 1) sends the {name} to worker processes, "
                       f"and {value!r} does not pickle ({type(e).__name__}: {e}). {fix}") from e


def _meta_shuffle(sched: Schedule) -> Any:
  """The checkpoint's record of the data order (a bool for the orders older runs could use)."""
  if sched.last_batch == "keep" and sched.shuffle in ("epoch", "none"):
    return sched.shuffle == "epoch"
  return f"{sched.shuffle}/{sched.last_batch}"


def _check_meta(ckpt: Path, meta: dict) -> None:
  ckpt.mkdir(parents=True, exist_ok=True)
  f = ckpt / "meta.json"
  if f.exists():
    old = json.loads(f.read_text())
    diff = [k for k in meta if old.get(k) != meta[k]]
    if diff:
      raise ValueError(f"checkpoint {ckpt} was written with different settings ({', '.join(diff)});"
                       " use another directory or delete it.")
  else:
    f.write_text(json.dumps(meta, indent=1))


def _chunk_file(ckpt: Path, c: int) -> Path:
  return ckpt / f"chunk_{c:06d}.npz"


def _save_chunk(ckpt: Path, c: int, rows: np.ndarray, leaves: list[np.ndarray]) -> None:
  arrays = {f"leaf_{i}": l for i, l in enumerate(leaves)}
  arrays["removed"] = rows
  _atomic_savez(_chunk_file(ckpt, c), arrays)


def _load_chunk(ckpt: Path, c: int, rows: np.ndarray) -> Optional[list[np.ndarray]]:
  f = _chunk_file(ckpt, c)
  if not f.exists():
    return None
  with np.load(f) as z:
    if not np.array_equal(z["removed"], rows):
      raise ValueError(f"{f}: removed indices differ from this run's chunk {c}.")
    return [z[f"leaf_{i}"] for i in range(len(z.files) - 1)]
