#include "common/collective_reduce.h"

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "common/dtype.h"
#include "common/reduce.h"

namespace gradd {

// The float types share DType's values, so size and accumulator come from
// common/dtype.h rather than a second table.
static_assert(static_cast<int>(CollectiveDType::kFloat32) ==
              static_cast<int>(DType::kFloat32));
static_assert(static_cast<int>(CollectiveDType::kFloat64) ==
              static_cast<int>(DType::kFloat64));
static_assert(static_cast<int>(CollectiveDType::kFloat16) ==
              static_cast<int>(DType::kFloat16));
static_assert(static_cast<int>(CollectiveDType::kBFloat16) ==
              static_cast<int>(DType::kBFloat16));

namespace {

// Integer sums wrap (two's complement) instead of being undefined: add as
// the unsigned type of the same width.
template <typename T>
T Add(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
  } else {
    return a + b;
  }
}

template <typename T>
T Combine(CollectiveOp op, T a, T b) {
  switch (op) {
    case CollectiveOp::kMin:
      return std::min(a, b);
    case CollectiveOp::kMax:
      return std::max(a, b);
    case CollectiveOp::kSum:
    case CollectiveOp::kAvg:
      break;
  }
  return Add(a, b);
}

template <typename T, CollectiveOp kOp>
void CombineInto(void* out, const void* a, const void* b, size_t n) {
  T* o = static_cast<T*>(out);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  for (size_t i = 0; i < n; ++i) o[i] = Combine(kOp, x[i], y[i]);
}

template <typename T>
CombineFn CombineFor(CollectiveOp op) {
  switch (op) {
    case CollectiveOp::kMin:
      return &CombineInto<T, CollectiveOp::kMin>;
    case CollectiveOp::kMax:
      return &CombineInto<T, CollectiveOp::kMax>;
    case CollectiveOp::kSum:
    case CollectiveOp::kAvg:
      break;
  }
  return &CombineInto<T, CollectiveOp::kSum>;
}

// out[i] = Combine(kOp, out[i], in[i]) over [begin, end); `out` and `in`
// never overlap (distinct areas), which lets the loop vectorise.
template <typename T, CollectiveOp kOp>
void CombineRange(T* __restrict out, const T* __restrict in, size_t begin,
                  size_t end) {
  for (size_t i = begin; i < end; ++i) out[i] = Combine(kOp, out[i], in[i]);
}

// Sources of type T reduced into an accumulator of type T (in place when
// acc == srcs[0]). The op is dispatched once, outside the loops.
template <typename T>
void ReduceSame(CollectiveOp op, const void* const* srcs, int n, void* acc,
                size_t begin, size_t end) {
  T* out = static_cast<T*>(acc);
  const T* first = static_cast<const T*>(srcs[0]);
  if (out != first) std::copy(first + begin, first + end, out + begin);
  for (int k = 1; k < n; ++k) {
    const T* in = static_cast<const T*>(srcs[k]);
    switch (op) {
      case CollectiveOp::kMin:
        CombineRange<T, CollectiveOp::kMin>(out, in, begin, end);
        break;
      case CollectiveOp::kMax:
        CombineRange<T, CollectiveOp::kMax>(out, in, begin, end);
        break;
      case CollectiveOp::kSum:
      case CollectiveOp::kAvg:
        CombineRange<T, CollectiveOp::kSum>(out, in, begin, end);
        break;
    }
  }
}

template <float (*ToFloat)(uint16_t)>
void Reduce16(CollectiveOp op, const void* const* srcs, int n, void* acc,
              size_t begin, size_t end) {
  float* out = static_cast<float*>(acc);
  const uint16_t* first = static_cast<const uint16_t*>(srcs[0]);
  for (size_t i = begin; i < end; ++i) out[i] = ToFloat(first[i]);
  for (int k = 1; k < n; ++k) {
    const uint16_t* in = static_cast<const uint16_t*>(srcs[k]);
    for (size_t i = begin; i < end; ++i) {
      out[i] = Combine(op, out[i], ToFloat(in[i]));
    }
  }
}

// The result into every destination: computed once into dsts[0] (which may
// be the accumulator itself: the in-place case), then copied to the others,
// so each loop is a plain vectorisable pass. An average divides in T (for
// float, a division by the exactly representable world size rounds as the
// division in double then rounded to float does).
template <typename T>
void WriteSame(CollectiveOp op, const void* acc, double divisor,
               void* const* dsts, int n, size_t begin, size_t end) {
  if (n <= 0 || begin >= end) return;
  const T* in = static_cast<const T*>(acc);
  T* first = static_cast<T*>(dsts[0]);
  if constexpr (std::is_floating_point_v<T>) {
    if (op == CollectiveOp::kAvg) {
      const T d = static_cast<T>(divisor);
      if (first == in) {
        for (size_t i = begin; i < end; ++i) first[i] = first[i] / d;
      } else {
        T* __restrict o = first;
        const T* __restrict x = in;
        for (size_t i = begin; i < end; ++i) o[i] = x[i] / d;
      }
      in = first;
    }
  }
  for (int k = 0; k < n; ++k) {
    T* dst = static_cast<T*>(dsts[k]);
    if (dst == in) continue;
    std::memcpy(dst + begin, in + begin, (end - begin) * sizeof(T));
  }
}

template <uint16_t (*FromFloat)(float)>
void Write16(CollectiveOp op, const void* acc, double divisor,
             void* const* dsts, int n, size_t begin, size_t end) {
  if (n <= 0 || begin >= end) return;
  // The float32 accumulator is never one of the 16-bit areas.
  const float* __restrict in = static_cast<const float*>(acc);
  uint16_t* __restrict first = static_cast<uint16_t*>(dsts[0]);
  if (op == CollectiveOp::kAvg) {
    const float d = static_cast<float>(divisor);
    for (size_t i = begin; i < end; ++i) first[i] = FromFloat(in[i] / d);
  } else {
    for (size_t i = begin; i < end; ++i) first[i] = FromFloat(in[i]);
  }
  for (int k = 1; k < n; ++k) {
    std::memcpy(static_cast<uint16_t*>(dsts[k]) + begin, first + begin,
                (end - begin) * sizeof(uint16_t));
  }
}

}  // namespace

absl::StatusOr<CollectiveDType> CollectiveDTypeFromInt(int32_t value) {
  if (value < 1 || value > 8) {
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown collective dtype ", value,
        " (float32=1, float64=2, float16=3, bfloat16=4, int32=5, int64=6, "
        "uint8=7, int8=8)"));
  }
  return static_cast<CollectiveDType>(value);
}

absl::StatusOr<CollectiveOp> CollectiveOpFromInt(int32_t value) {
  if (value < 0 || value > 3) {
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown reduce op ", value, " (sum=0, avg=1, min=2, max=3)"));
  }
  return static_cast<CollectiveOp>(value);
}

size_t CollectiveDTypeSize(CollectiveDType dtype) {
  switch (dtype) {
    case CollectiveDType::kInt64:
      return 8;
    case CollectiveDType::kInt32:
      return 4;
    case CollectiveDType::kUInt8:
    case CollectiveDType::kInt8:
      return 1;
    default:  // the float types: the same values as DType's
      return DTypeSize(static_cast<DType>(dtype));
  }
}

const char* CollectiveDTypeName(CollectiveDType dtype) {
  switch (dtype) {
    case CollectiveDType::kFloat32:
      return "float32";
    case CollectiveDType::kFloat64:
      return "float64";
    case CollectiveDType::kFloat16:
      return "float16";
    case CollectiveDType::kBFloat16:
      return "bfloat16";
    case CollectiveDType::kInt32:
      return "int32";
    case CollectiveDType::kInt64:
      return "int64";
    case CollectiveDType::kUInt8:
      return "uint8";
    case CollectiveDType::kInt8:
      return "int8";
  }
  return "unknown";
}

const char* CollectiveOpName(CollectiveOp op) {
  switch (op) {
    case CollectiveOp::kSum:
      return "sum";
    case CollectiveOp::kAvg:
      return "avg";
    case CollectiveOp::kMin:
      return "min";
    case CollectiveOp::kMax:
      return "max";
  }
  return "unknown";
}

bool IsIntegerDType(CollectiveDType dtype) {
  return static_cast<int32_t>(dtype) >= 5;
}

absl::Status CheckReduction(CollectiveDType dtype, CollectiveOp op) {
  if (op == CollectiveOp::kAvg && IsIntegerDType(dtype)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "reduce op avg is not supported for ", CollectiveDTypeName(dtype),
        " (integer) data; use sum and divide"));
  }
  return absl::OkStatus();
}

CollectiveDType ReductionAccumulator(CollectiveDType dtype) {
  if (IsIntegerDType(dtype)) return dtype;
  // The float types accumulate as the gradient buckets do.
  return static_cast<CollectiveDType>(
      AccumulatorDType(static_cast<DType>(dtype)));
}

void ReduceToAccumulator(CollectiveDType dtype, CollectiveOp op,
                         const void* const* srcs, int n, void* acc,
                         size_t begin, size_t end) {
  switch (dtype) {
    case CollectiveDType::kFloat32:
      return ReduceSame<float>(op, srcs, n, acc, begin, end);
    case CollectiveDType::kFloat64:
      return ReduceSame<double>(op, srcs, n, acc, begin, end);
    case CollectiveDType::kFloat16:
      return Reduce16<&HalfToFloat>(op, srcs, n, acc, begin, end);
    case CollectiveDType::kBFloat16:
      return Reduce16<&BFloat16ToFloat>(op, srcs, n, acc, begin, end);
    case CollectiveDType::kInt32:
      return ReduceSame<int32_t>(op, srcs, n, acc, begin, end);
    case CollectiveDType::kInt64:
      return ReduceSame<int64_t>(op, srcs, n, acc, begin, end);
    case CollectiveDType::kUInt8:
      return ReduceSame<uint8_t>(op, srcs, n, acc, begin, end);
    case CollectiveDType::kInt8:
      return ReduceSame<int8_t>(op, srcs, n, acc, begin, end);
  }
}

CombineFn CombineFunction(CollectiveDType accumulator, CollectiveOp op) {
  switch (accumulator) {
    case CollectiveDType::kFloat64:
      return CombineFor<double>(op);
    case CollectiveDType::kInt32:
      return CombineFor<int32_t>(op);
    case CollectiveDType::kInt64:
      return CombineFor<int64_t>(op);
    case CollectiveDType::kUInt8:
      return CombineFor<uint8_t>(op);
    case CollectiveDType::kInt8:
      return CombineFor<int8_t>(op);
    case CollectiveDType::kFloat32:
    case CollectiveDType::kFloat16:
    case CollectiveDType::kBFloat16:
      break;
  }
  return CombineFor<float>(op);
}

void WriteFromAccumulator(CollectiveDType dtype, CollectiveOp op,
                          const void* acc, double divisor, void* const* dsts,
                          int n, size_t begin, size_t end) {
  switch (dtype) {
    case CollectiveDType::kFloat32:
      return WriteSame<float>(op, acc, divisor, dsts, n, begin, end);
    case CollectiveDType::kFloat64:
      return WriteSame<double>(op, acc, divisor, dsts, n, begin, end);
    case CollectiveDType::kFloat16:
      return Write16<&FloatToHalf>(op, acc, divisor, dsts, n, begin, end);
    case CollectiveDType::kBFloat16:
      return Write16<&FloatToBFloat16>(op, acc, divisor, dsts, n, begin, end);
    case CollectiveDType::kInt32:
      return WriteSame<int32_t>(op, acc, divisor, dsts, n, begin, end);
    case CollectiveDType::kInt64:
      return WriteSame<int64_t>(op, acc, divisor, dsts, n, begin, end);
    case CollectiveDType::kUInt8:
      return WriteSame<uint8_t>(op, acc, divisor, dsts, n, begin, end);
    case CollectiveDType::kInt8:
      return WriteSame<int8_t>(op, acc, divisor, dsts, n, begin, end);
  }
}

}  // namespace gradd
