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
