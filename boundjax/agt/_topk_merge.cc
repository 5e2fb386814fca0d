// Running top-k merge for AGT's streaming descent bound (boundjax.agt.select).
//
// topk_merge(values: T[f, d], running: T[d, k]) -> T[d, k], attribute largest: bool.
// running[p] holds the k extreme values seen so far at coordinate p, sorted from the most
// extreme (largest first when largest, smallest first otherwise; -inf / +inf fill empty
// slots). The result holds the k extreme values of running[p] and values[:, p]: the same
// multiset as lax.top_k over their concatenation (ties give equal values, so the sorted
// arrays are identical). A value enters only when it is strictly more extreme than the
// current k-th; that test runs over blocks of coordinates (vectorised), and the rare insertion
// is a scalar insertion sort. NaN never compares more extreme, so it is not inserted (the
// caller's sums carry it).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

template <typename T, bool kLargest>
inline bool Better(T a, T b) {
  return kLargest ? a > b : a < b;
}

template <typename T, bool kLargest>
void Insert(T v, T* slot, int64_t k) {
  int64_t j = k - 1;
  while (j > 0 && Better<T, kLargest>(v, slot[j - 1])) {
    slot[j] = slot[j - 1];
    --j;
  }
  slot[j] = v;
}

template <typename T, bool kLargest>
void Merge(const T* values, int64_t f, int64_t d, int64_t k, T* out) {
  constexpr int64_t kBlock = 16;
  std::vector<T> thr(d);
  for (int64_t p = 0; p < d; ++p) thr[p] = out[p * k + (k - 1)];
  const int64_t full = d - d % kBlock;
  for (int64_t i = 0; i < f; ++i) {
    const T* row = values + i * d;
    for (int64_t p0 = 0; p0 < full; p0 += kBlock) {
      uint32_t mask = 0;
      for (int64_t q = 0; q < kBlock; ++q)
        mask |= static_cast<uint32_t>(Better<T, kLargest>(row[p0 + q], thr[p0 + q])) << q;
      while (mask) {
        const int64_t p = p0 + __builtin_ctz(mask);
        mask &= mask - 1;
        Insert<T, kLargest>(row[p], out + p * k, k);
        thr[p] = out[p * k + (k - 1)];
      }
    }
    for (int64_t p = full; p < d; ++p) {
      if (!Better<T, kLargest>(row[p], thr[p])) continue;
      Insert<T, kLargest>(row[p], out + p * k, k);
      thr[p] = out[p * k + (k - 1)];
    }
  }
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

// accumulate(g_n, d_l, d_u: T[f, d], sum_n, sum_l, sum_u, sum_abs: T[d], top_l, bot_u: T[d, k])
//   -> (sum_n, sum_l, sum_u, sum_abs, top_l, bot_u), attribute track_abs: bool.
// One pass over a chunk: the running sums (recursive summation in sample order) and the k
// largest lower / k smallest upper bounds, coordinate-blocked so that a block's sums and
// extremes stay in registers and L1 while the chunk's rows stream past.
template <typename T>
void Accumulate(const T* gn, const T* dl, const T* du, int64_t f, int64_t d, int64_t k,
                bool track_abs, T* sn, T* sl, T* su, T* sa, T* top, T* bot) {
  constexpr int64_t kBlock = 16;
  for (int64_t p0 = 0; p0 < d; p0 += kBlock) {
    const int64_t w = std::min(kBlock, d - p0);
    T an[kBlock], al[kBlock], au[kBlock], aa[kBlock], tl[kBlock], tu[kBlock];
    for (int64_t q = 0; q < w; ++q) {
      an[q] = sn[p0 + q]; al[q] = sl[p0 + q]; au[q] = su[p0 + q]; aa[q] = sa[p0 + q];
      tl[q] = k ? top[(p0 + q) * k + k - 1] : T(0);
      tu[q] = k ? bot[(p0 + q) * k + k - 1] : T(0);
    }
    for (int64_t i = 0; i < f; ++i) {
      const T* rn = gn + i * d + p0;
      const T* rl = dl + i * d + p0;
      const T* ru = du + i * d + p0;
      uint32_t ml = 0, mu = 0;
      if (w == kBlock) {
        for (int64_t q = 0; q < kBlock; ++q) {
          an[q] += rn[q]; al[q] += rl[q]; au[q] += ru[q];
          ml |= static_cast<uint32_t>(rl[q] > tl[q]) << q;
          mu |= static_cast<uint32_t>(ru[q] < tu[q]) << q;
        }
        if (track_abs)
          for (int64_t q = 0; q < kBlock; ++q) aa[q] += std::max(std::abs(rl[q]), std::abs(ru[q]));
      } else {
        for (int64_t q = 0; q < w; ++q) {
          an[q] += rn[q]; al[q] += rl[q]; au[q] += ru[q];
          if (track_abs) aa[q] += std::max(std::abs(rl[q]), std::abs(ru[q]));
          ml |= static_cast<uint32_t>(rl[q] > tl[q]) << q;
          mu |= static_cast<uint32_t>(ru[q] < tu[q]) << q;
        }
      }
      if (!k) continue;
      while (ml) {
        const int64_t q = __builtin_ctz(ml);
        ml &= ml - 1;
        T* slot = top + (p0 + q) * k;
        Insert<T, true>(rl[q], slot, k);
        tl[q] = slot[k - 1];
      }
      while (mu) {
        const int64_t q = __builtin_ctz(mu);
        mu &= mu - 1;
        T* slot = bot + (p0 + q) * k;
        Insert<T, false>(ru[q], slot, k);
        tu[q] = slot[k - 1];
      }
    }
    for (int64_t q = 0; q < w; ++q) {
      sn[p0 + q] = an[q]; sl[p0 + q] = al[q]; su[p0 + q] = au[q]; sa[p0 + q] = aa[q];
    }
  }
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

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(BoundjaxTopkMergeF32, TopkMergeImpl<ffi::F32>,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<bool>("largest"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(BoundjaxTopkMergeF64, TopkMergeImpl<ffi::F64>,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F64>>()
                                  .Arg<ffi::Buffer<ffi::F64>>()
                                  .Ret<ffi::Buffer<ffi::F64>>()
                                  .Attr<bool>("largest"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(BoundjaxAccumulateF32, AccumulateImpl<ffi::F32>,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<bool>("track_abs"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(BoundjaxAccumulateF64, AccumulateImpl<ffi::F64>,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F64>>()
                                  .Arg<ffi::Buffer<ffi::F64>>()
                                  .Arg<ffi::Buffer<ffi::F64>>()
                                  .Arg<ffi::Buffer<ffi::F64>>()
                                  .Arg<ffi::Buffer<ffi::F64>>()
                                  .Arg<ffi::Buffer<ffi::F64>>()
                                  .Arg<ffi::Buffer<ffi::F64>>()
                                  .Arg<ffi::Buffer<ffi::F64>>()
                                  .Arg<ffi::Buffer<ffi::F64>>()
                                  .Ret<ffi::Buffer<ffi::F64>>()
                                  .Ret<ffi::Buffer<ffi::F64>>()
                                  .Ret<ffi::Buffer<ffi::F64>>()
                                  .Ret<ffi::Buffer<ffi::F64>>()
                                  .Ret<ffi::Buffer<ffi::F64>>()
                                  .Ret<ffi::Buffer<ffi::F64>>()
                                  .Attr<bool>("track_abs"));
