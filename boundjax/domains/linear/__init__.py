"""The linear domain: backward linear bound propagation (CROWN) over an input box.

``crown(fn)(params, box)`` returns, for every output entry ``y_j`` of ``fn``, scalars
``[lower_j, upper_j]`` such that ``lower_j <= y_j(x) <= upper_j`` for every ``x`` in the box.

Method (Zhang et al., "Efficient Neural Network Robustness Certification with General
Activation Functions", NeurIPS 2018, §3; the backward form of auto_LiRPA):

* ``fn`` is traced to one flat program (`boundjax.core.program`: nested calls inlined) and
  every variable that depends on a box is marked *abstract*. What CROWN does with an abstract
  equation is decided by one record per primitive (`OPS`, an `OpRecord`: kind, index operands,
  additive operands, exact transpose, pattern safety, relaxation): *affine* equations (add, sub,
  mul/div by a concrete value, dot_general/conv with a concrete operand, reshapes, slices, pads,
  reduce_sum, average pooling, ...) are transposed exactly; ``max(x, c)`` / ``min(x, c)`` with
  concrete ``c`` are ReLUs; *nonlinear* equations get sound linear relaxations on their input
  box (`Lines`): exp, expm1, log, log1p, sqrt, rsqrt, even integer powers / square, abs
  (convex/concave: chord and tangent at the midpoint, CROWN §3.2), tanh, logistic, erf, erfc,
  atan (S-shaped: CROWN's tangent-through-an-end-point construction, or the chord where it
  holds on a box around 0, `_s_shaped`), ``c / d``
  with a box-dependent denominator of one sign (reciprocal lines), products of two
  box-dependent values (McCormick planes; ``x / d`` of two box-dependent operands is rewritten
  to ``x · (1 / d)``), dot_general (matmul, einsum) and conv_general_dilated whose two operands
  both depend on a box (McCormick planes of every scalar product, weighted per entry of a pivot
  operand so that a parameter box is concretised exactly; see *Products of two boxes* below),
  leaky ReLU (``where(x >= 0, x, αx)`` and ``max(x, αx)``), max/min of two
  box-dependent values, and max/min pooling (``reduce_window_max``, ``reduce_max``: below the
  entry with the largest lower bound, above the interval bound). GELU, SiLU, softplus, LayerNorm
  and attention are bounded through these pieces.
* **Interval fallback.** An abstract equation with no linear relaxation (softmax and the other
  composites of `boundjax.nn`, sort, cumulative max, a dot_general/convolution of two boxes of
  different dtypes, bfloat16/float16 arithmetic, comparisons, and under ``sound`` every smooth
  nonlinearity: only ReLUs, products and products of two boxes (single McCormick planes,
  offsets rounded outward), max/min of two boxes and max/min pooling, whose slopes are exact
  floats, keep their lines there) is
  bounded by the forward interval pass, and its output enters the backward pass as a fresh box
  variable: ``Λ`` stops there and is concretised against that interval, like an input. One
  `CrownFallbackWarning` per primitive names it and the user's line. Only a primitive with
  neither a relaxation nor an interval rule raises `UnsupportedPrimitiveError`.
* **Low precision.** A bfloat16/float16 equation (``nn.Dense(dtype=jnp.bfloat16)``, a
  ``x.astype(bf16).astype(f32)`` round trip) is never treated as exact: it falls back to its
  interval, computed in float32 and rounded outward to the low format (`_interval_low_precision`).
* For a target variable ``t`` with ``m`` entries the pass starts from ``Λ_t = I`` (shape
  ``(m, *t.shape)``) and walks the equations in reverse. An affine equation ``y = L(x) + y0``
  maps ``Λ_x += Lᵀ Λ_y`` (a vmapped `jax.vjp`) and ``bias += <Λ_y, y0>``; fan-out adds.
* A ReLU ``y = relu(t)`` with pre-activation bounds ``[l, u]`` uses the lines
  ``a_L t <= y <= a_U t + b_U``: stable neurons are exact (``a = 1`` if ``l >= 0``, ``a = 0``
  if ``u <= 0``); unstable ones take ``a_U = u / (u - l)``, ``b_U = -a_U l`` and the adaptive
  lower slope ``a_L = 1 if u > -l else 0`` (CROWN-Ada, §3.2 of the paper). For the lower bound
  positive entries of ``Λ`` take the lower line and negative ones the upper line; for the
  upper bound the other way round, so lower and upper bounds carry separate ``Λ``.
* At the input box ``x ∈ [c - r, c + r]``: ``lower = Λ·c - |Λ|·r + bias`` and
  ``upper = Λ·c + |Λ|·r + bias``.
* Pre-activation bounds of every ReLU come, in order, from a backward pass of their own
  (``intermediate="crown"``) or from interval propagation (``intermediate="ibp"``, i.e.
  CROWN-IBP, Zhang et al. ICLR 2020). A forward interval pass (the rule table of
  `boundjax.domains.interval`, fed with the refined bounds) runs alongside, and every CROWN bound
  is intersected with it, so the result is never looser than `bj.ibp`.

Cost. The backward passes from each ReLU layer dominate: for an MLP with hidden widths ``n_k``
a pass from layer ``k`` costs about ``2 n_k · Σ_{j<k} n_j n_{j-1}`` multiply-adds per example.
The part of every pass that runs before the first ReLU it meets (``I`` through the affine layers
above it) does not depend on the example; it is computed once per call and shared by the whole
batch, and the rest runs example by example (`jax.lax.map` over chunks of ``chunk_size``
examples, each chunk vmapped).

Targets the interval pass bounds exactly (`prefix.interval_exact`). A target reached from the
box through affine equations with one box operand, at most one of them combining entries (a
product with a concrete matrix or kernel, a sum), the others entry to entry (reshapes, crops,
padding, shifts and scalings, ReLUs), gets no backward pass: the range of ``Σ_j w_ij x_j`` over
a box is its sign-split interval bound, which is CROWN's bound of a first layer. A network's
first convolution and, before a max pooling, its first ReLU's output are such targets; their
dense passes (23k rows for a 32-channel 27x27 map) are neither run nor counted in the memory
budget.

Products of two boxes (dot_general, conv_general_dilated; `backward._dot_planes`,
`backward._dot_step`). Each output entry is ``Σ_k P_k Q_k``; every scalar product gets the
McCormick planes (McCormick 1976, §3), combined per entry of the *pivot* ``P`` with the weight
that gives ``Q`` the slope ``z`` = the point of ``P``'s box nearest 0 (exact once ``Q`` is
concretised: for ``P >= 0`` the lower plane is ``l_Q P``, the worst weight). The coefficient
maps are the product's own transposes with the bound arrays (``Λ_P = Λ ⋆ᵀ c_Q ∓ (1 - 2t) ⊙
(|Λ| ⋆ᵀ r_Q)``, ``Λ_Q = Λ ⋆ᵀ z``): batched, jit-friendly, two or three products of the size of
an affine transpose. The pivot is the lhs unless only the lhs is a parameter box. A parameter
box ``Q`` (a box input read by this equation only: a weight) is concretised at once rather than
carried as a coefficient array of ``Q``'s size per row (for a kernel of 784 x 256 that array
would be 200k entries per bounded neuron); with a single example (``P`` without free
dimensions) this needs no ``Λ_Q`` at all. The forward interval of such a product is the
interval domain's "best" (midpoint-radius met with sign-split). For a batch of examples with a
shared parameter box, vmap ``bj.crown(f, batch_axis=None)`` over the examples (``batch_axis=0``
would split the parameter box as if it were a batch). Not yet done: a product of a *concrete*
operand with a parameter box (``x @ W`` for a fixed input ``x``) is affine and still carries
``Λ`` of ``W``'s size (2 · m · |W| floats per example; 400 MB for a 784 x 256 kernel and a
256-neuron target): concretising it at once is the same step with a point pivot.

Windows (``patches=True``, the default). For a target behind one ReLU layer
whose input ``s = A x + b`` is an affine map of the box (e.g. the second convolution of a CNN),
the rows of ``Λ`` are non-zero only on receptive fields: at trace time the non-zero patterns of
``Λ`` at ``relu(s)`` and of ``A`` are found by the same transposes with every concrete
coefficient set to 1 (all terms non-negative, so no cancellation: a superset of the true
pattern). Rows with the same support ``S_g`` in ``s`` form a group with input window ``X_g``;
per example only ``ν`` on ``S_g`` (k entries, not all of ``s``), ``Λ_x = ν A[S_g, X_g]`` (one
batched matrix product) and the concretisation over ``X_g`` are computed. On the issue's CNN
(conv16 k4 s2, conv32 k4) a conv2 neuron sees 256 of conv1's 2704 outputs and 100 of 784
pixels, which removes the dense transpose of conv1 applied to 2 x 3200 rows per example. The
bounds are those of the dense pass up to the order of float sums.

Specifications (``spec=C``). The backward pass of the output starts from ``Λ = C`` instead of
``I``, so ``C @ y`` (e.g. the margins ``y_label - y_j``) is bounded directly, which is never
looser than bounding ``y`` and combining (CROWN §3.3). ``C`` of shape (k, m) is shared; (batch,
k, m) gives each example its own rows: the example-independent prefix (computed once with
``I``) is multiplied by ``C[i]`` per example, so nothing of size batch × m × n is formed.

α-CROWN (``alpha=True``; Xu et al., "Fast and Complete", ICLR 2021). The lower slopes of
unstable ReLU neurons behind each output are optimised in [0, 1] with Adam, by gradients through
the bound, one set of slopes per row of the bounds; each row keeps its best iterate, and the
result is the entrywise best of CROWN's and the optimised bound. With
``alpha_intermediate=True`` (α-CROWN, §3.2) every ReLU layer's own bounds get slopes too (one
set per neuron of the layer), optimised for the output's bound through the intermediate bounds
they tighten: each step reruns the forward pass, whose bounds are met with CROWN's.

Unstable rows only (``unstable_rows``). A ReLU neuron whose input box (its interval image met
with known bounds and splits) lies on one side of the kink has an exact relaxation, so no
tighter bound of it changes the output's; the back-substitution of a layer's bounds starts from
its unstable neurons only, gathered into a static number of rows (measured outside ``jit`` by
an interval pass, rounded up to a power of two). The output bounds do not change; where most
neurons are stable (small boxes, sub-problems of branch and bound) the pass is that much
cheaper.

Split constraints (``splits=True``; β-CROWN, Wang et al., NeurIPS 2021, §3.1). The bounded
function then takes keyword arguments describing sub-problems: per ReLU node (the distinct
box-dependent inputs ``z`` of ``max(z, c)``/``min(z, c)`` in program order) a sign array
(``+1``: ``z >= 0``, ``-1``: ``z <= 0``, ``0``: free), known bounds ``pre`` (e.g. a parent's)
and a warm start ``(alpha, beta)``, batched like the boxes. The bounds hold over the points of
the box where the constraints hold: each node's bounds are met with ``pre`` and clipped by its
signs (so split ReLUs are exact), a sub-problem whose clipped bounds are empty is infeasible
(output ``[+inf, -inf]``), and with ``beta=True`` the multipliers ``β >= 0`` of the
constraints are optimised with α (``min_{s z >= 0} g >= min (g - β s z)``), also in sound mode
(the ``β s`` terms enter the rounding slack like any coefficient). ``return_info=True`` returns
a `CrownInfo` with the nodes' bounds, infeasibility, α, β and the coefficients of the lower
bounds on every node's output and every input (BaBSR scores, minimising corners).

Batching (``batch_axis``). With ``batch_axis=0`` (default) the batch of boxes is split into
examples and ``fn`` is bounded on each example as a batch of one: *only `Interval` leaves are
split along ``batch_axis``*; concrete leaves (parameters) are passed whole. Every output leaf
that depends on a box must have size 1 along ``batch_axis`` in that batch-of-one call and the
results are concatenated along it; outputs that do not depend on a box are returned as computed
once. This assumes ``fn`` treats examples independently (true for feed-forward networks, false
for layers with batch statistics). ``batch_axis=None`` bounds the whole call as one problem.

Sound floating point (``sound=True``). Every bound holds for the exact real-number
evaluation of ``fn`` with its float parameters (concrete intermediate values, e.g. a reshaped
bias, are taken as computed). The rounding error of every computed ``Λ`` and bias is bounded a
priori with Higham's ``γ_n`` (see `boundjax.core.rounding`): for a step whose transpose sums at most
``n`` terms into an entry of ``Λ_x`` that receives ``k`` contributions,
``|Λ̃_x - Lᵀ Λ̃_y| <= γ_{n+k} |L|ᵀ |Λ̃_y|``, which moves the bound by at most
``γ_{n+k} |Λ̃_y|·(|L| |x|_max)`` (``|x|_max`` from the sound forward interval pass). These
slacks, the error of the bias sums and of the final dot products are added up (a cheap
matrix-vector product per step), doubled to cover the error of computing them, and the result
is rounded outward with ``nextafter``. ReLU upper lines are rounded up (``a_U`` and ``b_U``),
which keeps them valid. On a GPU, matmuls run with ``precision="highest"`` in this mode (the
error model assumes float32 products and sums). The windowed pass is sound the same way: its
ReLU lines are those of sound mode, and it is widened by the γ_n bounds of its own sums (k
terms per entry of ``Λ_x = ν M``, 2k + 2q + 1 in the final sum) plus the slacks of the two
prefixes it reads (``μ`` and ``M``, each weighted by the magnitudes of what they multiply).

Modules: `rules` (one record per primitive, relaxations, classification), `backward` (the
backward and forward passes), `windows` (the windowed pass), `api` (`crown`).
"""

from boundjax.domains.linear import api, backward, prefix, rules, windows  # noqa: F401
from boundjax.domains.linear.api import CrownInfo, crown  # noqa: F401
from boundjax.domains.linear.rules import (INTERMEDIATE_MODES, OPS, SUPPORTED,
                                           CrownFallbackWarning, OpRecord)

__all__ = ["crown", "CrownFallbackWarning", "OpRecord", "OPS", "SUPPORTED",
           "INTERMEDIATE_MODES"]
