// Native streaming fold for AGT's descent bound (boundjax.agt.select; AGT, Thm 4.6 in §4.2).
//
// The k extreme values per coordinate are kept in k slots in no particular order, with the
// least extreme of them (the threshold) and its slot tracked per coordinate. A value enters
// only when it is strictly more extreme than the threshold: it replaces that slot, and the
// threshold is recomputed over the k slots. The slots then hold the k extremes of everything
// seen, as a multiset (equal values are interchangeable), whatever the order of arrival; so
// their sum, the only use, is that of lax.top_k over the concatenation. NaN never compares
// more extreme, so it does not enter (the caller's sums carry it).
//
// topk_merge(values: T[f, d], running: T[d, k]) -> T[d, k]; attribute largest.
// accumulate(g_n, d_l, d_u: T[f, d], sum_n, sum_l, sum_u, sum_abs: T[d], top_l, bot_u: T[d, k])
//   -> (sum_n, sum_l, sum_u, sum_abs, top_l, bot_u); attribute track_abs. One pass over a
//   chunk: the running sums (the chunk summed in double in sample order, then added to the
//   running sum with one rounding: at least as accurate as XLA's float32 reduction, which the
//   bounds are compared against) and the k largest lower /
//   k smallest upper bounds. Coordinates are taken in tiles: a tile's sums and thresholds stay
//   in cache while the chunk's rows stream past, each row's segment read contiguously
//   (vectorised sums and threshold tests; the rare replacements are scalar).
// accumulate_outer(zn, zl, zu: T[f, n], dn, dl, du: T[f, m], sums: T[n * m], top_l, bot_u:
//   T[n * m, k]) -> as accumulate; attributes gamma, track_abs. The same fold for a Dense
//   kernel's per-sample gradients, the outer products z_i (x) d_i, from their factors: the box
//   of each entry is the corner product of [zl, zu] and [dl, du] (0 * inf = 0, as
//   boundjax.ibp's product of two boxes; a non-finite z gives the whole line), the nominal value
//   zn * dn, each clipped to [-gamma, gamma]. The products are formed a tile of rows at a time
//   and never written out: memory traffic is O(f * (n + m)) per tile instead of O(f * n * m).
// accumulate_poison(zn, dn, zl, zu, dl, du, pzl, pzu, pdl, pdu, sums, top_du, bot_dl): the
//   poisoning fold (boundjax.agt.poisoning) the same way: sums of the nominal and of the clean
//   boxes, the k largest max(iwp_U - wp_U, 0) and k smallest min(iwp_L - wp_L, 0), wp the clean
//   box of an entry and iwp its poisoned box (the factor boxes [pzl, pzu] x [pdl, pdu]).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <thread>
#include <utility>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr int64_t kTile = 512;

template <typename T, bool kLargest>
inline bool Better(T a, T b) {
  return kLargest ? a > b : a < b;
}

// The k slots of one coordinate: the threshold (least extreme slot) and where it is.
template <typename T, bool kLargest>
struct Slots {
  T* slot;      // [d, k]
  T* thr;       // [d]
  int32_t* at;  // [d]
  int64_t k;

  void Init(int64_t p) {
    const T* s = slot + p * k;
    T m = s[0];
    int32_t w = 0;
    for (int32_t j = 1; j < k; ++j) {  // branch-free: the slots' order is data
      const bool b = Better<T, kLargest>(m, s[j]);
      m = b ? s[j] : m;
      w = b ? j : w;
    }
    thr[p] = m;
    at[p] = w;
  }

  inline void Offer(T v, int64_t p) {
    if (!Better<T, kLargest>(v, thr[p])) return;
    slot[p * k + at[p]] = v;
    Init(p);
  }
};

// The k largest lower bounds (hi) and k smallest upper bounds (lo) of d coordinates, their
// thresholds initialised from the running slots.
template <typename T>
struct Extremes {
  std::vector<T> thr_l, thr_u;
  std::vector<int32_t> at_l, at_u;
  Slots<T, true> hi;
  Slots<T, false> lo;

  Extremes(T* top, T* bot, int64_t d, int64_t k)
      : thr_l(d), thr_u(d), at_l(d), at_u(d),
        hi{top, thr_l.data(), at_l.data(), k}, lo{bot, thr_u.data(), at_u.data(), k} {
    if (k)
      for (int64_t p = 0; p < d; ++p) {
        hi.Init(p);
        lo.Init(p);
      }
  }
};

// Calls fn(p) for every p in [t0, t1) with mask[p - t0] != 0, reading the mask 8 bytes at a
// time (most are zero: values rarely beat the threshold).
template <typename Fn>
inline void ForEachSet(const uint8_t* mask, int64_t t0, int64_t t1, Fn fn) {
  const int64_t n = t1 - t0;
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    uint64_t w;
    __builtin_memcpy(&w, mask + j, 8);
    while (w) {
      const int bit = __builtin_ctzll(w);
      w &= w - 1;
      fn(t0 + j + bit / 8);
      w &= ~(uint64_t(0xff) << (bit / 8 * 8));
    }
  }
  for (; j < n; ++j)
    if (mask[j]) fn(t0 + j);
}

// The chunk's sums (in double) added to the running sums with one rounding each.
template <typename T>
inline void AddChunkSums(int64_t p0, int64_t w, bool track_abs, const double* an,
                         const double* al, const double* au, const double* aa, T* sn, T* sl,
                         T* su, T* sa) {
  for (int64_t q = 0; q < w; ++q) {
    const int64_t p = p0 + q;
    sn[p] = static_cast<T>(static_cast<double>(sn[p]) + an[q]);
    sl[p] = static_cast<T>(static_cast<double>(sl[p]) + al[q]);
    su[p] = static_cast<T>(static_cast<double>(su[p]) + au[q]);
    if (track_abs) sa[p] = static_cast<T>(static_cast<double>(sa[p]) + aa[q]);
  }
}

template <typename T, bool kLargest>
void Merge(const T* __restrict values, int64_t f, int64_t d, int64_t k, T* out) {
  std::vector<T> thr(d);
  std::vector<int32_t> at(d);
  Slots<T, kLargest> s{out, thr.data(), at.data(), k};
  for (int64_t p = 0; p < d; ++p) s.Init(p);
  uint8_t mask[kTile];
  for (int64_t t0 = 0; t0 < d; t0 += kTile) {
    const int64_t t1 = std::min(t0 + kTile, d);
    for (int64_t i = 0; i < f; ++i) {
      const T* __restrict row = values + i * d;
      const T* __restrict th = s.thr;
      for (int64_t q = t0; q < t1; ++q)
        mask[q - t0] = static_cast<uint8_t>(Better<T, kLargest>(row[q], th[q]));
      ForEachSet(mask, t0, t1, [&](int64_t p) { s.Offer(row[p], p); });
    }
  }
}

template <typename T>
void Accumulate(const T* __restrict gn, const T* __restrict dl, const T* __restrict du,
                int64_t f, int64_t d, int64_t k, bool track_abs, T* __restrict sn,
                T* __restrict sl, T* __restrict su, T* __restrict sa, T* top, T* bot) {
  Extremes<T> ex(top, bot, d, k);
  Slots<T, true>& hi = ex.hi;
  Slots<T, false>& lo = ex.lo;
  uint8_t mask[kTile];
  double an[kTile], al[kTile], au[kTile], aa[kTile];  // a tile's chunk sums, in double
  for (int64_t t0 = 0; t0 < d; t0 += kTile) {
    const int64_t t1 = std::min(t0 + kTile, d);
    const int64_t w = t1 - t0;
    std::fill(an, an + w, 0.0);
    std::fill(al, al + w, 0.0);
    std::fill(au, au + w, 0.0);
    std::fill(aa, aa + w, 0.0);
    for (int64_t i = 0; i < f; ++i) {
      const T* __restrict rn = gn + i * d + t0;
      const T* __restrict rl = dl + i * d + t0;
      const T* __restrict ru = du + i * d + t0;
      for (int64_t q = 0; q < w; ++q) {
        an[q] += rn[q];
        al[q] += rl[q];
        au[q] += ru[q];
      }
      if (track_abs)
        for (int64_t q = 0; q < w; ++q) aa[q] += std::max(std::abs(rl[q]), std::abs(ru[q]));
      rl -= t0;
      ru -= t0;
      if (!k) continue;
      const T* __restrict tl = hi.thr;
      const T* __restrict tu = lo.thr;
      for (int64_t q = t0; q < t1; ++q)
        mask[q - t0] = static_cast<uint8_t>((rl[q] > tl[q]) | ((ru[q] < tu[q]) << 1));
      ForEachSet(mask, t0, t1, [&](int64_t p) {
        hi.Offer(rl[p], p);
        lo.Offer(ru[p], p);
      });
    }
    AddChunkSums(t0, w, track_abs, an, al, au, aa, sn, sl, su, sa);
  }
}



// Clip_g(x) = min(max(x, -g), g), keeping NaN as jnp.clip does.
template <typename T>
inline T ClipNan(T x, T g) {
  x = x < -g ? -g : x;
  return x > g ? g : x;
}

// The clipped box of the product of [a, b] and [x, y]: min / max of the four corner products
// with 0 * inf = 0 (boundjax.ibp's product of two boxes), or the whole line when `whole`.
template <typename T>
inline void CornerBox(T a, T b, T x, T y, T g, T& l, T& h) {
  T c1 = a * x, c2 = a * y, c3 = b * x, c4 = b * y;
  c1 = c1 == c1 ? c1 : T(0);
  c2 = c2 == c2 ? c2 : T(0);
  c3 = c3 == c3 ? c3 : T(0);
  c4 = c4 == c4 ? c4 : T(0);
  const T m12 = c2 < c1 ? c2 : c1, m34 = c4 < c3 ? c4 : c3;
  const T x12 = c2 > c1 ? c2 : c1, x34 = c4 > c3 ? c4 : c3;
  l = ClipNan(m34 < m12 ? m34 : m12, g);
  h = ClipNan(x34 > x12 ? x34 : x12, g);
}

// The clipped whole line, for entries whose z bound is not finite (and the sums' signature).
template <typename T>
inline void WholeLine(T g, T& l, T& h) {
  l = ClipNan(-std::numeric_limits<T>::infinity(), g);
  h = ClipNan(std::numeric_limits<T>::infinity(), g);
}

// A row's factors: entry j of row i of sample s is [a, b] x [dl[j], du[j]] (whole line when a
// bound of z is not finite) with nominal c * dn[j].
template <typename T>
struct RowFactors {
  const T* dl;
  const T* du;
  T a, b;
  bool whole;
};

// One row of a sample's outer product: the clipped box and the clipped nominal value of its m
// entries added to the tile's sums (qa: the larger end's magnitude), the box written to lbo /
// ubo and the threshold test (l beats tl, h beats tu) to mask; returns whether any entry hit.
// (The row's pointers are parameters: GCC vectorises loads through __restrict parameters, not
// through struct members. Each loop keeps to one or two element types, which it vectorises.)
template <typename T>
__attribute__((noinline))
void OuterRowLoop(const T* __restrict dl, const T* __restrict du, T a, T b, bool whole,
                         const T* __restrict dn, T c, T g, int64_t m, double* __restrict qn,
                         double* __restrict ql, double* __restrict qu, T* __restrict lbo,
                         T* __restrict ubo) {
  T wl, wh;
  WholeLine(g, wl, wh);
  if (whole) {  // (rare: a separate loop keeps the common one free of the flag)
    for (int64_t j = 0; j < m; ++j) {
      qn[j] += ClipNan(c * dn[j], g);
      ql[j] += wl;
      qu[j] += wh;
      lbo[j] = wl;
      ubo[j] = wh;
    }
    return;
  }
  for (int64_t j = 0; j < m; ++j) {
    const T x = dl[j], y = du[j];
    T l, h;
    CornerBox(a, b, x, y, g, l, h);
    qn[j] += ClipNan(c * dn[j], g);
    ql[j] += l;
    qu[j] += h;
    lbo[j] = l;
    ubo[j] = h;
  }
}

// The magnitudes of a row's boxes added to qa, and its threshold test (l beats tl, h beats tu)
// written to mask; returns whether any entry hit.
template <typename T>
inline int RowTests(const T* __restrict lbo, const T* __restrict ubo, int64_t m,
                    double* __restrict qa, const T* __restrict tl, const T* __restrict tu,
                    uint8_t* __restrict mask, bool track_abs, bool test) {
  if (track_abs)
    for (int64_t j = 0; j < m; ++j) qa[j] += std::max(std::abs(lbo[j]), std::abs(ubo[j]));
  if (!test) return 0;
  int any = 0;
  for (int64_t j = 0; j < m; ++j) {
    const int hit = static_cast<int>(lbo[j] > tl[j]) | (static_cast<int>(ubo[j] < tu[j]) << 1);
    mask[j] = static_cast<uint8_t>(hit);
    any |= hit;
  }
  return any;
}

template <typename T>
inline int OuterRow(RowFactors<T> r, const T* dn, T c, T g, int64_t m, double* qn, double* ql,
                    double* qu, double* qa, T* lbo, T* ubo, const T* tl, const T* tu,
                    uint8_t* mask, bool track_abs, bool test) {
  OuterRowLoop(r.dl, r.du, r.a, r.b, r.whole, dn, c, g, m, qn, ql, qu, lbo, ubo);
  return RowTests(lbo, ubo, m, qa, tl, tu, mask, track_abs, test);
}

// One row of the poisoning fold (boundjax.agt.poisoning): the clean box [lc, hc] (sums) and the
// poisoned box [lp, hp] of each entry; the differences max(hp - hc, 0) (to lbo, tested against
// tl: the k largest) and min(lp - lc, 0) (to ubo, against tu: the k smallest).
template <typename T, bool kFlags>
__attribute__((noinline)) void PoisonRowLoop(const T* __restrict dl, const T* __restrict du, T a,
                                             T b, bool whole,
                          const T* __restrict pdl, const T* __restrict pdu, T pa, T pb,
                          bool pwhole, const T* __restrict dn, T c, T g, int64_t m,
                          double* __restrict qn, double* __restrict ql, double* __restrict qu,
                          double* __restrict qa, T* __restrict lbo, T* __restrict ubo) {
  for (int64_t j = 0; j < m; ++j) {
    const T x = dl[j], y = du[j], px = pdl[j], py = pdu[j];
    T lc, hc, lp, hp;
    CornerBox(a, b, x, y, g, lc, hc);
    CornerBox(pa, pb, px, py, g, lp, hp);
    if constexpr (kFlags) {  // (a loop without the flags vectorises)
      if (whole) WholeLine(g, lc, hc);
      if (pwhole) WholeLine(g, lp, hp);
    }
    qn[j] += ClipNan(c * dn[j], g);
    ql[j] += lc;
    qu[j] += hc;
    qa[j] += std::max(std::max(std::abs(lc), std::abs(hc)), std::max(std::abs(lp), std::abs(hp)));
    const T du_ = hp - hc, dl_ = lp - lc;
    lbo[j] = du_ > T(0) ? du_ : T(0);
    ubo[j] = dl_ < T(0) ? dl_ : T(0);
  }
}

template <typename T>
inline int PoisonRow(RowFactors<T> cl, RowFactors<T> po, const T* dn, T c, T g, int64_t m,
                     double* qn, double* ql, double* qu, double* qa, T* lbo, T* ubo,
                     const T* tl, const T* tu, uint8_t* mask, bool /*track_abs*/, bool test) {
  if (cl.whole || po.whole)
    PoisonRowLoop<T, true>(cl.dl, cl.du, cl.a, cl.b, cl.whole, po.dl, po.du, po.a, po.b,
                           po.whole, dn, c, g, m, qn, ql, qu, qa, lbo, ubo);
  else
    PoisonRowLoop<T, false>(cl.dl, cl.du, cl.a, cl.b, false, po.dl, po.du, po.a, po.b, false,
                            dn, c, g, m, qn, ql, qu, qa, lbo, ubo);
  return RowTests(lbo, ubo, m, qa, tl, tu, mask, false, test);
}

// The factors of a chunk's per-sample values: nominal zn (f, n), dn (f, m); boxes [zl, zu],
// [dl, du]; for the poisoning fold also the poisoned boxes [pzl, pzu], [pdl, pdu].
template <typename T>
struct Factors {
  const T* zn;
  const T* dn;
  const T* zl;
  const T* zu;
  const T* dl;
  const T* du;
  const T* pzl = nullptr;
  const T* pzu = nullptr;
  const T* pdl = nullptr;
  const T* pdu = nullptr;
  int64_t f, n, m;

  RowFactors<T> Row(const T* l, const T* u, const T* rdl, const T* rdu, int64_t s,
                    int64_t i) const {
    const T a = l[s * n + i], b = u[s * n + i];
    return {rdl + s * m, rdu + s * m, a, b, !(std::isfinite(a) && std::isfinite(b))};
  }
};

// The samples in decreasing order of max|z| * max|d| (their largest possible entry; the
// poisoned boxes for the poisoning fold): the extremes tend to arrive first, so the thresholds
// rise early and fewer values enter the slots. (Which values end in the slots does not depend
// on the order.)
template <typename T>
std::vector<int64_t> ExtremesFirst(const Factors<T>& x, bool poison) {
  const T* zl = poison ? x.pzl : x.zl;
  const T* zu = poison ? x.pzu : x.zu;
  const T* dl = poison ? x.pdl : x.dl;
  const T* du = poison ? x.pdu : x.du;
  std::vector<double> key(x.f);
  for (int64_t s = 0; s < x.f; ++s) {
    T a = 0, b = 0;
    for (int64_t i = 0; i < x.n; ++i)
      a = std::max(a, std::max(std::abs(zl[s * x.n + i]), std::abs(zu[s * x.n + i])));
    for (int64_t j = 0; j < x.m; ++j)
      b = std::max(b, std::max(std::abs(dl[s * x.m + j]), std::abs(du[s * x.m + j])));
    key[s] = static_cast<double>(a) * static_cast<double>(b);
  }
  std::vector<int64_t> order(x.f);
  for (int64_t s = 0; s < x.f; ++s) order[s] = s;
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t p, int64_t q) { return key[p] > key[q]; });
  return order;
}

// Rows [r0, r1) of the kernel, a tile of rows at a time: the tile's sums stay in cache while
// every sample's factors stream past (samples in `order`). hi keeps the k largest of the
// values written to lb, lo the k smallest of those written to ub.
template <typename T, bool kPoison>
void FoldRows(const Factors<T>& x, const std::vector<int64_t>& order, int64_t k, T gamma,
              bool track_abs, int64_t r0, int64_t r1, Slots<T, true> hi, Slots<T, false> lo,
              T* __restrict sn, T* __restrict sl, T* __restrict su, T* __restrict sa) {
  const int64_t m = x.m;
  const int64_t rows = std::max<int64_t>(1, kTile / std::max<int64_t>(m, 1));
  const int64_t cap = rows * m;
  std::vector<double> an(cap), al(cap), au(cap), aa(cap);
  std::vector<T> lb(cap), ub(cap);
  std::vector<uint8_t> mask(cap);
  for (int64_t i0 = r0; i0 < r1; i0 += rows) {
    const int64_t i1 = std::min(i0 + rows, r1);
    const int64_t w = (i1 - i0) * m;
    const int64_t p0 = i0 * m;
    for (auto* v : {&an, &al, &au, &aa}) std::fill(v->begin(), v->begin() + w, 0.0);
    for (const int64_t s : order) {
      const T* __restrict rdn = x.dn + s * m;
      for (int64_t i = i0; i < i1; ++i) {
        const int64_t o = (i - i0) * m;
        const T c = x.zn[s * x.n + i];
        const RowFactors<T> clean = x.Row(x.zl, x.zu, x.dl, x.du, s, i);
        int any;
        if constexpr (kPoison)
          any = PoisonRow<T>(clean, x.Row(x.pzl, x.pzu, x.pdl, x.pdu, s, i), rdn, c, gamma, m,
                             &an[o], &al[o], &au[o], &aa[o], &lb[o], &ub[o], hi.thr + p0 + o,
                             lo.thr + p0 + o, &mask[o], track_abs, k > 0);
        else
          any = OuterRow<T>(clean, rdn, c, gamma, m, &an[o], &al[o], &au[o], &aa[o], &lb[o],
                            &ub[o], hi.thr + p0 + o, lo.thr + p0 + o, &mask[o], track_abs,
                            k > 0);
        if (k && any)
          ForEachSet(&mask[o], 0, m, [&](int64_t j) {
            hi.Offer(lb[o + j], p0 + o + j);
            lo.Offer(ub[o + j], p0 + o + j);
          });
      }
    }
    AddChunkSums(p0, w, track_abs, an.data(), al.data(), au.data(), aa.data(), sn, sl, su, sa);
  }
}

// The fold of a chunk of Dense-kernel factors into the running sums and k-extreme slots (the
// privacy fold, or with kPoison the poisoning fold), rows split between threads (disjoint
// coordinates: no shared writes) when the work is large enough to pay for starting them.
template <typename T, bool kPoison>
void FoldOuter(const Factors<T>& x, int64_t k, T gamma, bool track_abs, T* sn, T* sl, T* su,
               T* sa, T* top, T* bot) {
  Extremes<T> ex(top, bot, x.n * x.m, k);
  const std::vector<int64_t> order = ExtremesFirst(x, kPoison);
  const int64_t hw = std::max<int64_t>(1, std::thread::hardware_concurrency());
  const int64_t work = x.f * x.n * x.m * (kPoison ? 2 : 1);
  const int64_t threads = std::min<int64_t>({hw, x.n, std::max<int64_t>(1, work >> 20)});
  auto run = [&](int64_t r0, int64_t r1) {
    FoldRows<T, kPoison>(x, order, k, gamma, track_abs, r0, r1, ex.hi, ex.lo, sn, sl, su, sa);
  };
  std::vector<std::thread> pool;
  for (int64_t t = 1; t < threads; ++t)
    pool.emplace_back(run, x.n * t / threads, x.n * (t + 1) / threads);
  run(0, x.n / threads);
  for (auto& th : pool) th.join();
}

template <ffi::DataType DT>
ffi::Error TopkMergeImpl(ffi::Buffer<DT> values, ffi::Buffer<DT> running,
                         ffi::ResultBuffer<DT> out, bool largest) {
  using T = ffi::NativeType<DT>;
  auto rdims = running.dimensions();
  if (rdims.size() != 2) return ffi::Error::InvalidArgument("running must be (d, k)");
  const int64_t d = rdims[0], k = rdims[1];
  auto vdims = values.dimensions();
  if (vdims.size() != 2 || vdims[1] != d)
    return ffi::Error::InvalidArgument("values must be (f, d) with d as in running");
  const int64_t f = vdims[0];
  T* o = out->typed_data();
  std::copy(running.typed_data(), running.typed_data() + d * k, o);
  if (k == 0 || f == 0) return ffi::Error::Success();
  if (largest)
    Merge<T, true>(values.typed_data(), f, d, k, o);
  else
    Merge<T, false>(values.typed_data(), f, d, k, o);
  return ffi::Error::Success();
}

template <ffi::DataType DT>
ffi::Error AccumulateImpl(ffi::Buffer<DT> gn, ffi::Buffer<DT> dl, ffi::Buffer<DT> du,
                          ffi::Buffer<DT> sn, ffi::Buffer<DT> sl, ffi::Buffer<DT> su,
                          ffi::Buffer<DT> sa, ffi::Buffer<DT> top, ffi::Buffer<DT> bot,
                          ffi::ResultBuffer<DT> on, ffi::ResultBuffer<DT> ol,
                          ffi::ResultBuffer<DT> ou, ffi::ResultBuffer<DT> oa,
                          ffi::ResultBuffer<DT> otop, ffi::ResultBuffer<DT> obot,
                          bool track_abs) {
  using T = ffi::NativeType<DT>;
  auto tdims = top.dimensions();
  if (tdims.size() != 2) return ffi::Error::InvalidArgument("top_l must be (d, k)");
  const int64_t d = tdims[0], k = tdims[1];
  auto vdims = dl.dimensions();
  if (vdims.size() != 2 || vdims[1] != d)
    return ffi::Error::InvalidArgument("per-sample values must be (f, d)");
  const int64_t f = vdims[0];
  auto copy = [](const auto& in, auto& out) {
    std::copy(in.typed_data(), in.typed_data() + in.element_count(), out->typed_data());
  };
  copy(sn, on); copy(sl, ol); copy(su, ou); copy(sa, oa); copy(top, otop); copy(bot, obot);
  Accumulate<T>(gn.typed_data(), dl.typed_data(), du.typed_data(), f, d, k, track_abs,
                on->typed_data(), ol->typed_data(), ou->typed_data(), oa->typed_data(),
                otop->typed_data(), obot->typed_data());
  return ffi::Error::Success();
}


// The running state's buffers copied to the results (the fold then updates the results).
template <typename A, typename R>
void CopyTo(const A& in, R& out) {
  std::copy(in.typed_data(), in.typed_data() + in.element_count(), out->typed_data());
}

// Whether two buffers' shapes are equal.
template <typename A, typename B>
bool SameShape(const A& a, const B& b) {
  const auto x = a.dimensions(), y = b.dimensions();
  return x.size() == y.size() && std::equal(x.begin(), x.end(), y.begin());
}

// The running state (four sums, two slot arrays) copied to the results, then the chunk's
// factors `x` folded into them (the privacy fold, or with kPoison the poisoning fold).
template <bool kPoison, ffi::DataType DT>
ffi::Error FoldInto(Factors<ffi::NativeType<DT>> x, ffi::Buffer<DT> sn, ffi::Buffer<DT> sl,
                    ffi::Buffer<DT> su, ffi::Buffer<DT> sa, ffi::Buffer<DT> top,
                    ffi::Buffer<DT> bot, ffi::ResultBuffer<DT> on, ffi::ResultBuffer<DT> ol,
                    ffi::ResultBuffer<DT> ou, ffi::ResultBuffer<DT> oa,
                    ffi::ResultBuffer<DT> otop, ffi::ResultBuffer<DT> obot, double gamma,
                    bool track_abs) {
  using T = ffi::NativeType<DT>;
  auto tdims = top.dimensions();
  if (tdims.size() != 2 || tdims[0] != x.n * x.m || !SameShape(top, bot))
    return ffi::Error::InvalidArgument("the running extremes must be (n * m, k)");
  CopyTo(sn, on); CopyTo(sl, ol); CopyTo(su, ou); CopyTo(sa, oa); CopyTo(top, otop);
  CopyTo(bot, obot);
  FoldOuter<T, kPoison>(x, tdims[1], static_cast<T>(gamma), track_abs, on->typed_data(),
                        ol->typed_data(), ou->typed_data(), oa->typed_data(),
                        otop->typed_data(), obot->typed_data());
  return ffi::Error::Success();
}

template <ffi::DataType DT>
ffi::Error AccumulateOuterImpl(ffi::Buffer<DT> zn, ffi::Buffer<DT> zl, ffi::Buffer<DT> zu,
                               ffi::Buffer<DT> dn, ffi::Buffer<DT> dl, ffi::Buffer<DT> du,
                               ffi::Buffer<DT> sn, ffi::Buffer<DT> sl, ffi::Buffer<DT> su,
                               ffi::Buffer<DT> sa, ffi::Buffer<DT> top, ffi::Buffer<DT> bot,
                               ffi::ResultBuffer<DT> on, ffi::ResultBuffer<DT> ol,
                               ffi::ResultBuffer<DT> ou, ffi::ResultBuffer<DT> oa,
                               ffi::ResultBuffer<DT> otop, ffi::ResultBuffer<DT> obot,
                               double gamma, bool track_abs) {
  auto zdims = zl.dimensions(), ddims = dl.dimensions();
  if (zdims.size() != 2 || ddims.size() != 2 || zdims[0] != ddims[0])
    return ffi::Error::InvalidArgument("factors must be (f, n) and (f, m)");
  Factors<ffi::NativeType<DT>> x{zn.typed_data(), dn.typed_data(), zl.typed_data(),
                                 zu.typed_data(), dl.typed_data(), du.typed_data()};
  x.f = zdims[0]; x.n = zdims[1]; x.m = ddims[1];
  return FoldInto<false>(x, sn, sl, su, sa, top, bot, on, ol, ou, oa, otop, obot, gamma,
                         track_abs);
}

// The poisoning fold: (zn, dn, clean zl, zu, dl, du, poisoned zl, zu, dl, du, sum_n, sum_l,
// sum_u, sum_abs, top_du, bot_dl) -> (sum_n, sum_l, sum_u, sum_abs, top_du, bot_dl).
template <ffi::DataType DT>
ffi::Error AccumulatePoisonImpl(ffi::Buffer<DT> zn, ffi::Buffer<DT> dn, ffi::Buffer<DT> zl,
                                ffi::Buffer<DT> zu, ffi::Buffer<DT> dl, ffi::Buffer<DT> du,
                                ffi::Buffer<DT> pzl, ffi::Buffer<DT> pzu, ffi::Buffer<DT> pdl,
                                ffi::Buffer<DT> pdu, ffi::Buffer<DT> sn, ffi::Buffer<DT> sl,
                                ffi::Buffer<DT> su, ffi::Buffer<DT> sa, ffi::Buffer<DT> top,
                                ffi::Buffer<DT> bot, ffi::ResultBuffer<DT> on,
                                ffi::ResultBuffer<DT> ol, ffi::ResultBuffer<DT> ou,
                                ffi::ResultBuffer<DT> oa, ffi::ResultBuffer<DT> otop,
                                ffi::ResultBuffer<DT> obot, double gamma, bool track_abs) {
  auto zdims = zl.dimensions(), ddims = dl.dimensions();
  if (zdims.size() != 2 || ddims.size() != 2 || zdims[0] != ddims[0] ||
      !SameShape(pzl, zl) || !SameShape(pzu, zl) || !SameShape(pdl, dl) || !SameShape(pdu, dl))
    return ffi::Error::InvalidArgument("factors must be (f, n) and (f, m), clean and poisoned");
  Factors<ffi::NativeType<DT>> x{zn.typed_data(),  dn.typed_data(),  zl.typed_data(),
                                 zu.typed_data(),  dl.typed_data(),  du.typed_data(),
                                 pzl.typed_data(), pzu.typed_data(), pdl.typed_data(),
                                 pdu.typed_data()};
  x.f = zdims[0]; x.n = zdims[1]; x.m = ddims[1];
  return FoldInto<true>(x, sn, sl, su, sa, top, bot, on, ol, ou, oa, otop, obot, gamma,
                        track_abs);
}

}  // namespace

#define BOUNDJAX_ARGS2(DT) .Arg<ffi::Buffer<ffi::DT>>().Arg<ffi::Buffer<ffi::DT>>()
#define BOUNDJAX_ARGS3(DT) BOUNDJAX_ARGS2(DT).Arg<ffi::Buffer<ffi::DT>>()
#define BOUNDJAX_RETS3(DT) .Ret<ffi::Buffer<ffi::DT>>().Ret<ffi::Buffer<ffi::DT>>() \
                           .Ret<ffi::Buffer<ffi::DT>>()

#define BOUNDJAX_MERGE(NAME, DT)                                                      \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(NAME, TopkMergeImpl<ffi::DT>,                         \
                                ffi::Ffi::Bind() BOUNDJAX_ARGS2(DT)                   \
                                    .Ret<ffi::Buffer<ffi::DT>>()                      \
                                    .Attr<bool>("largest"));

// (g_n, d_l, d_u, four sums, top_l, bot_u) -> (four sums, top_l, bot_u)
#define BOUNDJAX_ACCUMULATE(NAME, DT)                                                 \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(NAME, AccumulateImpl<ffi::DT>,                        \
                                ffi::Ffi::Bind() BOUNDJAX_ARGS3(DT) BOUNDJAX_ARGS3(DT) \
                                    BOUNDJAX_ARGS3(DT) BOUNDJAX_RETS3(DT)             \
                                    BOUNDJAX_RETS3(DT)                                \
                                    .Attr<bool>("track_abs"));

// (zn, zl, zu, dn, dl, du, four sums, top_l, bot_u) -> (four sums, top_l, bot_u)
#define BOUNDJAX_ACCUMULATE_OUTER(NAME, DT)                                           \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(NAME, AccumulateOuterImpl<ffi::DT>,                   \
                                ffi::Ffi::Bind() BOUNDJAX_ARGS3(DT) BOUNDJAX_ARGS3(DT) \
                                    BOUNDJAX_ARGS3(DT) BOUNDJAX_ARGS3(DT)             \
                                    BOUNDJAX_RETS3(DT) BOUNDJAX_RETS3(DT)             \
                                    .Attr<double>("gamma")                            \
                                    .Attr<bool>("track_abs"));

BOUNDJAX_MERGE(BoundjaxTopkMergeF32, F32)
BOUNDJAX_MERGE(BoundjaxTopkMergeF64, F64)
BOUNDJAX_ACCUMULATE(BoundjaxAccumulateF32, F32)
BOUNDJAX_ACCUMULATE(BoundjaxAccumulateF64, F64)
// (zn, dn, clean and poisoned factor boxes, four sums, top_du, bot_dl) -> (four sums, ...)
#define BOUNDJAX_ACCUMULATE_POISON(NAME, DT)                                          \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(NAME, AccumulatePoisonImpl<ffi::DT>,                  \
                                ffi::Ffi::Bind() BOUNDJAX_ARGS2(DT) BOUNDJAX_ARGS2(DT) \
                                    BOUNDJAX_ARGS2(DT) BOUNDJAX_ARGS2(DT)             \
                                    BOUNDJAX_ARGS2(DT) BOUNDJAX_ARGS3(DT)             \
                                    BOUNDJAX_ARGS3(DT) BOUNDJAX_RETS3(DT)             \
                                    BOUNDJAX_RETS3(DT)                                \
                                    .Attr<double>("gamma")                            \
                                    .Attr<bool>("track_abs"));

BOUNDJAX_ACCUMULATE_OUTER(BoundjaxAccumulateOuterF32, F32)
BOUNDJAX_ACCUMULATE_OUTER(BoundjaxAccumulateOuterF64, F64)
BOUNDJAX_ACCUMULATE_POISON(BoundjaxAccumulatePoisonF32, F32)
BOUNDJAX_ACCUMULATE_POISON(BoundjaxAccumulatePoisonF64, F64)
