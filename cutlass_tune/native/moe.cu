// The MoE experts layer's glue as CUDA kernels (cutlass_tune/runtime/_moe.py calls them where
// they are built): the gather of token rows into routed rows, the combine of routed rows back
// to tokens, and the routing weights' gradient of either.
//
//   moe_gather(x, inv, weights?, top_k)  out[inv[t * top_k + j]] = w[t, j] * x[t]       (S x H)
//   moe_combine(y, inv, weights?, top_k) out[t] = sum_j w[t, j] * y[inv[t * top_k + j]] (T x H)
//   moe_weights_grad(a, b, inv, top_k)   g[t, j] = <a[t], b[inv[t * top_k + j]]>         (T x top_k, fp32)
//   moe_route(ids, num_experts)          the routing of S expert ids: a stable counting sort
//                                        (sorted ids, perm, inv, E int32 row ends)
//
// inv is the routing's inverse permutation (slot s = t * top_k + j is routed row inv[s]; int64,
// S = T * top_k values, each row once: the kernels do not check it, which would need a host
// sync). weights are float32, S values (T x top_k), None meaning one. One block per token: it
// reads its token row once (gather) or its top_k routed rows once (combine) in 16-byte vectors
// where the rows allow, and accumulates in fp32 in the order j = 0 .. top_k - 1, so every call
// gives the same bits (no atomics). Gather and combine are each other's adjoint; the autograd
// that says so is ops.cpp's (its Autograd kernels, in this CUDA build only); the fake
// implementations are Python's (runtime/_moe_routing.py).

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <cstdint>
#include <type_traits>

namespace {

constexpr int kMaxThreads = 256;

template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

int threads_for(int64_t vectors) {
  int64_t warps = (vectors + 31) / 32;
  int64_t threads = warps * 32;
  return static_cast<int>(threads < 32 ? 32 : threads > kMaxThreads ? kMaxThreads : threads);
}

// 16 bytes / sizeof(T) where every row of every tensor starts 16-byte aligned, else 1.
template <typename T>
int vector_width(int64_t hidden, std::initializer_list<const void*> pointers) {
  constexpr int wide = 16 / sizeof(T);
  if (wide <= 1 || hidden % wide) return 1;
  for (const void* p : pointers) {
    if (reinterpret_cast<uintptr_t>(p) % 16) return 1;
  }
  return wide;
}

// fn(std::integral_constant<int, VEC>) for the vector width `width` (VEC elements of T in 16
// bytes at most; 1 where the rows are not 16-byte aligned).
template <typename T, typename Fn>
void with_width(int width, Fn&& fn) {
  if constexpr (16 / sizeof(T) >= 8) {
    if (width == 8) return fn(std::integral_constant<int, 8>{});
  }
  if constexpr (16 / sizeof(T) >= 4) {
    if (width == 4) return fn(std::integral_constant<int, 4>{});
  }
  if constexpr (16 / sizeof(T) >= 2) {
    if (width == 2) return fn(std::integral_constant<int, 2>{});
  }
  return fn(std::integral_constant<int, 1>{});
}

// Token t's top_k routed rows and weights into shared memory (rows[j] = inv[t * top_k + j]).
template <bool WEIGHTED>
__device__ void load_slots(const int64_t* __restrict__ inv, const float* __restrict__ w, int top_k, int64_t t,
                           int64_t* rows, float* scales) {
  for (int j = threadIdx.x; j < top_k; j += blockDim.x) {
    rows[j] = inv[t * top_k + j];
    scales[j] = WEIGHTED ? w[t * top_k + j] : 1.f;
  }
  __syncthreads();
}

template <typename T, int VEC, bool WEIGHTED>
__global__ void gather_kernel(const T* __restrict__ x, const int64_t* __restrict__ inv, const float* __restrict__ w,
                              T* __restrict__ out, int top_k, int64_t vectors) {
  extern __shared__ __align__(16) unsigned char shared[];
  int64_t* rows = reinterpret_cast<int64_t*>(shared);
  float* scales = reinterpret_cast<float*>(rows + top_k);
  const int64_t t = blockIdx.x;
  load_slots<WEIGHTED>(inv, w, top_k, t, rows, scales);
  using P = Pack<T, VEC>;
  const P* src = reinterpret_cast<const P*>(x) + t * vectors;
  P* dst = reinterpret_cast<P*>(out);
  for (int64_t v = threadIdx.x; v < vectors; v += blockDim.x) {
    const P p = src[v];
    for (int j = 0; j < top_k; ++j) {
      P q;
      if (WEIGHTED) {
#pragma unroll
        for (int i = 0; i < VEC; ++i) q.v[i] = static_cast<T>(static_cast<float>(p.v[i]) * scales[j]);
      } else {
        q = p;
      }
      dst[rows[j] * vectors + v] = q;
    }
  }
}

template <typename T, int VEC, bool WEIGHTED>
__global__ void combine_kernel(const T* __restrict__ y, const int64_t* __restrict__ inv, const float* __restrict__ w,
                               T* __restrict__ out, int top_k, int64_t vectors) {
  extern __shared__ __align__(16) unsigned char shared[];
  int64_t* rows = reinterpret_cast<int64_t*>(shared);
  float* scales = reinterpret_cast<float*>(rows + top_k);
  const int64_t t = blockIdx.x;
  load_slots<WEIGHTED>(inv, w, top_k, t, rows, scales);
  using P = Pack<T, VEC>;
  const P* src = reinterpret_cast<const P*>(y);
  P* dst = reinterpret_cast<P*>(out) + t * vectors;
  for (int64_t v = threadIdx.x; v < vectors; v += blockDim.x) {
    float acc[VEC];
#pragma unroll
    for (int i = 0; i < VEC; ++i) acc[i] = 0.f;
    for (int j = 0; j < top_k; ++j) {
      const P p = src[rows[j] * vectors + v];
#pragma unroll
      for (int i = 0; i < VEC; ++i) {
        // A rounded product, then the sum (no fused multiply-add): torch's order of roundings.
        const float term = WEIGHTED ? __fmul_rn(scales[j], static_cast<float>(p.v[i])) : static_cast<float>(p.v[i]);
        acc[i] = __fadd_rn(acc[i], term);
      }
    }
    P q;
#pragma unroll
    for (int i = 0; i < VEC; ++i) q.v[i] = static_cast<T>(acc[i]);
    dst[v] = q;
  }
}

// Which way a call moves rows: a gather writes each token row to its top_k routed rows, a
// combine sums each token's top_k routed rows. One block per token either way.
enum class Direction { kGather, kCombine };

template <Direction D, typename T, int VEC, bool WEIGHTED>
constexpr auto rows_kernel() {
  if constexpr (D == Direction::kGather) {
    return gather_kernel<T, VEC, WEIGHTED>;
  } else {
    return combine_kernel<T, VEC, WEIGHTED>;
  }
}

// The block's sum of one float per thread, in a fixed order (warp shuffles, then warp 0 over
// the warps' sums); every thread gets it.
__device__ float block_sum(float value, float* warp_sums) {
  for (int offset = 16; offset > 0; offset >>= 1) value += __shfl_down_sync(0xffffffffu, value, offset);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = (blockDim.x + 31) / 32;
  if (lane == 0) warp_sums[warp] = value;
  __syncthreads();
  if (warp == 0) {
    value = lane < warps ? warp_sums[lane] : 0.f;
    for (int offset = 16; offset > 0; offset >>= 1) value += __shfl_down_sync(0xffffffffu, value, offset);
    if (lane == 0) warp_sums[0] = value;
  }
  __syncthreads();
  const float total = warp_sums[0];
  __syncthreads();  // warp_sums is reused by the next call
  return total;
}

template <typename T, int VEC>
__global__ void weights_grad_kernel(const T* __restrict__ a, const T* __restrict__ b, const int64_t* __restrict__ inv,
                                    float* __restrict__ out, int top_k, int64_t vectors) {
  __shared__ float warp_sums[kMaxThreads / 32];
  const int64_t t = blockIdx.x;
  using P = Pack<T, VEC>;
  const P* row_a = reinterpret_cast<const P*>(a) + t * vectors;
  for (int j = 0; j < top_k; ++j) {
    const P* row_b = reinterpret_cast<const P*>(b) + inv[t * top_k + j] * vectors;
    float partial = 0.f;
    for (int64_t v = threadIdx.x; v < vectors; v += blockDim.x) {
      const P p = row_a[v], q = row_b[v];
#pragma unroll
      for (int i = 0; i < VEC; ++i) partial += static_cast<float>(p.v[i]) * static_cast<float>(q.v[i]);
    }
    const float total = block_sum(partial, warp_sums);
    if (threadIdx.x == 0) out[t * top_k + j] = total;
  }
}

void check_routing(const char* op, const at::Tensor& rows, const at::Tensor& inv, const c10::optional<at::Tensor>& weights,
                   int64_t top_k) {
  TORCH_CHECK(rows.is_cuda(), op, ": expects CUDA tensors, got one on ", rows.device());
  TORCH_CHECK(rows.dim() == 2, op, ": expects a 2-D tensor of rows, got ", rows.dim(), "-D");
  TORCH_CHECK(top_k > 0, op, ": top_k must be positive, got ", top_k);
  TORCH_CHECK(inv.dim() == 1 && inv.scalar_type() == at::kLong, op, ": inv must be 1-D int64 (the routing's inverse "
              "permutation), got ", inv.scalar_type(), " of ", inv.dim(), " dimensions");
  TORCH_CHECK(inv.numel() % top_k == 0, op, ": inv holds ", inv.numel(), " slots, not a multiple of top_k ", top_k);
  TORCH_CHECK(inv.device() == rows.device(), op, ": inv is on ", inv.device(), " and the rows on ", rows.device());
  if (weights.has_value()) {
    TORCH_CHECK(weights->scalar_type() == at::kFloat, op, ": weights must be float32, got ", weights->scalar_type());
    TORCH_CHECK(weights->numel() == inv.numel(), op, ": weights hold ", weights->numel(), " values for ", inv.numel(),
                " slots");
    TORCH_CHECK(weights->device() == rows.device(), op, ": weights are on ", weights->device(), " and the rows on ",
                rows.device());
  }
  TORCH_CHECK(rows.scalar_type() == at::kFloat || rows.scalar_type() == at::kHalf ||
                  rows.scalar_type() == at::kBFloat16,
              op, ": rows must be float32, float16 or bfloat16, got ", rows.scalar_type());
}

// moe_gather (D kGather: `in` is x, T x H) and moe_combine (kCombine: `in` is y, S x H), written
// into `out` where it is given and fits (contiguous, the result's shape, type and device: Inductor's
// buffer, ops.cpp's out variants), else into a new tensor, which is returned.
template <Direction D>
at::Tensor move_rows_into(const at::Tensor& in, const at::Tensor& inv_in, const c10::optional<at::Tensor>& weights_in,
                          int64_t top_k, const at::Tensor* given) {
  constexpr bool gather = D == Direction::kGather;
  constexpr const char* op = gather ? "cutlass_tune::moe_gather" : "cutlass_tune::moe_combine";
  check_routing(op, in, inv_in, weights_in, top_k);
  const int64_t slots = inv_in.numel(), tokens = slots / top_k, hidden = in.size(1);
  if constexpr (gather) {
    TORCH_CHECK(in.size(0) == tokens, op, ": x has ", in.size(0), " rows for ", tokens, " tokens (", slots,
                " slots of top_k ", top_k, ")");
  } else {
    TORCH_CHECK(in.size(0) == slots, op, ": y has ", in.size(0), " rows for ", slots, " routed slots");
  }
  const c10::cuda::CUDAGuard guard(in.device());
  const at::Tensor src = in.contiguous(), inv = inv_in.contiguous();
  const at::Tensor weights = weights_in.has_value() ? weights_in->contiguous() : at::Tensor();
  const int64_t out_rows = gather ? slots : tokens;
  const bool fits = given != nullptr && given->is_contiguous() && given->numel() == out_rows * hidden &&
                    given->scalar_type() == src.scalar_type() && given->device() == src.device();
  at::Tensor out = fits ? given->view({out_rows, hidden}) : at::empty({out_rows, hidden}, src.options());
  if (tokens == 0 || hidden == 0) return out;
  const auto stream = c10::cuda::getCurrentCUDAStream();
  const size_t shared = top_k * (sizeof(int64_t) + sizeof(float));
  const float* w = weights.defined() ? weights.data_ptr<float>() : nullptr;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, src.scalar_type(), op, [&] {
    const int width = vector_width<scalar_t>(hidden, {src.data_ptr(), out.data_ptr()});
    const int64_t vectors = hidden / width;
    const int threads = threads_for(vectors);
    with_width<scalar_t>(width, [&](auto vec) {
      constexpr int VEC = decltype(vec)::value;
      const auto kernel = w ? rows_kernel<D, scalar_t, VEC, true>() : rows_kernel<D, scalar_t, VEC, false>();
      kernel<<<tokens, threads, shared, stream>>>(src.data_ptr<scalar_t>(), inv.data_ptr<int64_t>(), w,
                                                  out.data_ptr<scalar_t>(), top_k, vectors);
    });
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

template <Direction D>
at::Tensor move_rows(const at::Tensor& in, const at::Tensor& inv, const c10::optional<at::Tensor>& weights,
                     int64_t top_k) {
  return move_rows_into<D>(in, inv, weights, top_k, nullptr);
}

at::Tensor moe_weights_grad(const at::Tensor& a_in, const at::Tensor& b_in, const at::Tensor& inv_in, int64_t top_k) {
  check_routing("cutlass_tune::moe_weights_grad", a_in, inv_in, c10::nullopt, top_k);
  check_routing("cutlass_tune::moe_weights_grad", b_in, inv_in, c10::nullopt, top_k);
  const int64_t slots = inv_in.numel(), tokens = slots / top_k, hidden = a_in.size(1);
  TORCH_CHECK(a_in.size(0) == tokens && b_in.size(0) == slots && b_in.size(1) == hidden,
              "cutlass_tune::moe_weights_grad: a must be ", tokens, " x H token rows and b ", slots,
              " x H routed rows, got ", a_in.sizes(), " and ", b_in.sizes());
  TORCH_CHECK(a_in.scalar_type() == b_in.scalar_type(), "cutlass_tune::moe_weights_grad: a is ", a_in.scalar_type(),
              " and b ", b_in.scalar_type());
  const c10::cuda::CUDAGuard guard(a_in.device());
  const at::Tensor a = a_in.contiguous(), b = b_in.contiguous(), inv = inv_in.contiguous();
  at::Tensor out = at::zeros({tokens, top_k}, a.options().dtype(at::kFloat));
  if (tokens == 0 || hidden == 0) return out;
  const auto stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, a.scalar_type(), "moe_weights_grad", [&] {
    const int width = vector_width<scalar_t>(hidden, {a.data_ptr(), b.data_ptr()});
    const int64_t vectors = hidden / width;
    const int threads = threads_for(vectors);
    with_width<scalar_t>(width, [&](auto vec) {
      constexpr int VEC = decltype(vec)::value;
      weights_grad_kernel<scalar_t, VEC><<<tokens, threads, 0, stream>>>(
          a.data_ptr<scalar_t>(), b.data_ptr<scalar_t>(), inv.data_ptr<int64_t>(), out.data_ptr<float>(), top_k,
          vectors);
    });
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}


// ---------------------------------------------------------------------------------------------
// The routing (runtime/_moe_routing.py's `moe_routing`): a stable counting sort of the S expert
// ids by expert in three launches, each O(S) and none waiting on the host, in place of a radix
// sort of int64 keys (on an H200, 33 us of GPU time for S = 3072), a searchsorted and a scatter.
// Bucket of a slot: its id, or E for an id outside [0, E) (another rank's experts sort last).
//   1. route_counts: each block of kRouteThreads slots counts its slots per bucket
//      (counts[bucket * blocks + block]: bucket-major).
//   2. route_scan: one block scans the counts exclusively: counts[bucket * blocks + block] is then
//      where that block's first slot of that bucket goes; offsets[e] = the start of bucket e + 1.
//   3. route_place: each block ranks its slots within their bucket in slot order again and writes
//      perm[pos] = s, inv[s] = pos, sorted[pos] = ids[s].
// A slot's rank in its block: the lanes of its warp with the same bucket before it
// (__match_any_sync), plus the same bucket's slots in the block's earlier warps (a warps x buckets
// table in shared memory).

constexpr int kRouteThreads = 1024;
constexpr int kRouteWarps = kRouteThreads / 32;

template <typename I>
__device__ int route_bucket(const I* ids, int64_t s, int64_t slots, int experts) {
  if (s >= slots) return -1;
  const I id = ids[s];
  return (id < 0 || id >= experts) ? experts : static_cast<int>(id);
}

// The slot's rank among the block's slots of its bucket before it; warp_counts (kRouteWarps x
// buckets, zeroed by the caller) holds each warp's count per bucket afterwards.
__device__ int route_rank(int bucket, int buckets, int* warp_counts) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const unsigned peers = __match_any_sync(0xffffffffu, bucket);
  const int in_warp = __popc(peers & ((1u << lane) - 1u));
  if (bucket >= 0 && in_warp == 0) warp_counts[warp * buckets + bucket] = __popc(peers);
  __syncthreads();
  int rank = in_warp;
  if (bucket >= 0) {
    for (int w = 0; w < warp; ++w) rank += warp_counts[w * buckets + bucket];
  }
  return rank;
}

template <typename I>
__global__ void route_counts(const I* __restrict__ ids, int64_t slots, int experts, int* __restrict__ counts) {
  extern __shared__ int warp_counts[];
  const int buckets = experts + 1;
  for (int i = threadIdx.x; i < kRouteWarps * buckets; i += blockDim.x) warp_counts[i] = 0;
  __syncthreads();
  const int64_t s = static_cast<int64_t>(blockIdx.x) * kRouteThreads + threadIdx.x;
  route_rank(route_bucket(ids, s, slots, experts), buckets, warp_counts);
  for (int b = threadIdx.x; b < buckets; b += blockDim.x) {
    int total = 0;
    for (int w = 0; w < kRouteWarps; ++w) total += warp_counts[w * buckets + b];
    counts[static_cast<int64_t>(b) * gridDim.x + blockIdx.x] = total;
  }
}

// One block: counts (n = buckets x blocks, bucket-major) scanned exclusively in place; offsets[e]
// = the scanned value at bucket e + 1's first block (the end of expert e's rows).
__global__ void route_scan(int* __restrict__ counts, int64_t n, int blocks, int experts, int* __restrict__ offsets) {
  __shared__ int sums[kRouteThreads];
  const int64_t per = (n + blockDim.x - 1) / blockDim.x;
  const int64_t begin = threadIdx.x * per, end = begin + per < n ? begin + per : n;
  int local = 0;
  for (int64_t i = begin; i < end; ++i) local += counts[i];
  sums[threadIdx.x] = local;
  __syncthreads();
  for (int offset = 1; offset < static_cast<int>(blockDim.x); offset <<= 1) {  // inclusive scan of the threads' sums
    const int add = threadIdx.x >= offset ? sums[threadIdx.x - offset] : 0;
    __syncthreads();
    sums[threadIdx.x] += add;
    __syncthreads();
  }
  int running = threadIdx.x > 0 ? sums[threadIdx.x - 1] : 0;
  for (int64_t i = begin; i < end; ++i) {
    const int count = counts[i];
    counts[i] = running;
    running += count;
  }
  __syncthreads();
  for (int e = threadIdx.x; e < experts; e += blockDim.x) offsets[e] = counts[static_cast<int64_t>(e + 1) * blocks];
}

template <typename I>
__global__ void route_place(const I* __restrict__ ids, int64_t slots, int experts, const int* __restrict__ starts,
                            I* __restrict__ sorted, int64_t* __restrict__ perm, int64_t* __restrict__ inv) {
  extern __shared__ int warp_counts[];
  const int buckets = experts + 1;
  for (int i = threadIdx.x; i < kRouteWarps * buckets; i += blockDim.x) warp_counts[i] = 0;
  __syncthreads();
  const int64_t s = static_cast<int64_t>(blockIdx.x) * kRouteThreads + threadIdx.x;
  const int bucket = route_bucket(ids, s, slots, experts);
  const int rank = route_rank(bucket, buckets, warp_counts);
  if (bucket >= 0) {
    const int64_t pos = starts[static_cast<int64_t>(bucket) * gridDim.x + blockIdx.x] + rank;
    perm[pos] = s;
    inv[s] = pos;
    sorted[pos] = ids[s];
  }
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> moe_route(const at::Tensor& ids_in, int64_t num_experts) {
  constexpr const char* op = "cutlass_tune::moe_route";
  TORCH_CHECK(ids_in.is_cuda(), op, ": expects CUDA expert ids, got them on ", ids_in.device());
  TORCH_CHECK(ids_in.scalar_type() == at::kLong || ids_in.scalar_type() == at::kInt, op,
              ": expert ids must be int64 or int32, got ", ids_in.scalar_type());
  TORCH_CHECK(num_experts > 0, op, ": num_experts must be positive, got ", num_experts);
  const int64_t smem = static_cast<int64_t>(kRouteWarps) * (num_experts + 1) * sizeof(int);
  TORCH_CHECK(smem <= 200 * 1024, op, ": ", num_experts, " experts are more than the routing kernel holds (",
              200 * 1024 / (kRouteWarps * sizeof(int)) - 1, ")");
  const c10::cuda::CUDAGuard guard(ids_in.device());
  const at::Tensor ids = ids_in.reshape(-1).contiguous();
  const int64_t slots = ids.numel();
  TORCH_CHECK(slots < (int64_t{1} << 31), op, ": ", slots, " routed slots are more than int32 offsets hold");
  at::Tensor sorted = at::empty_like(ids);
  at::Tensor perm = at::empty({slots}, ids.options().dtype(at::kLong));
  at::Tensor inv = at::empty({slots}, ids.options().dtype(at::kLong));
  at::Tensor offsets = at::empty({num_experts}, ids.options().dtype(at::kInt));
  if (slots == 0) {
    offsets.zero_();
    return {sorted, perm, inv, offsets};
  }
  const int experts = static_cast<int>(num_experts);
  const int blocks = static_cast<int>((slots + kRouteThreads - 1) / kRouteThreads);
  at::Tensor counts = at::empty({(num_experts + 1) * blocks}, ids.options().dtype(at::kInt));
  const auto stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_INDEX_TYPES(ids.scalar_type(), op, [&] {
    const auto count_kernel = route_counts<index_t>;
    const auto place_kernel = route_place<index_t>;
    if (smem > 48 * 1024) {
      C10_CUDA_CHECK(cudaFuncSetAttribute(count_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
      C10_CUDA_CHECK(cudaFuncSetAttribute(place_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    }
    count_kernel<<<blocks, kRouteThreads, smem, stream>>>(ids.data_ptr<index_t>(), slots, experts,
                                                           counts.data_ptr<int>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    route_scan<<<1, kRouteThreads, 0, stream>>>(counts.data_ptr<int>(), counts.numel(), blocks, experts,
                                                offsets.data_ptr<int>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    place_kernel<<<blocks, kRouteThreads, smem, stream>>>(ids.data_ptr<index_t>(), slots, experts,
                                                           counts.data_ptr<int>(), sorted.data_ptr<index_t>(),
                                                           perm.data_ptr<int64_t>(), inv.data_ptr<int64_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return {sorted, perm, inv, offsets};
}

}  // namespace

namespace cutlass_tune_moe {

// The gather (`combine` false) or the combine of rows into `out` (Inductor's buffer: ops.cpp's
// moe_gather_out and moe_combine_out), copied in where the kernels wrote a tensor of their own
// (an `out` that does not fit the result).
void rows_into(bool combine, const at::Tensor& in, const at::Tensor& inv, const c10::optional<at::Tensor>& weights,
               int64_t top_k, at::Tensor& out) {
  const at::Tensor result = combine ? move_rows_into<Direction::kCombine>(in, inv, weights, top_k, &out)
                                    : move_rows_into<Direction::kGather>(in, inv, weights, top_k, &out);
  if (result.data_ptr() != out.data_ptr()) {
    out.copy_(result.reshape(out.sizes()));
  }
}

}  // namespace cutlass_tune_moe

TORCH_LIBRARY_FRAGMENT(cutlass_tune, m) {
  m.def("moe_gather(Tensor x, Tensor inv, Tensor? weights, int top_k) -> Tensor");
  m.def("moe_combine(Tensor y, Tensor inv, Tensor? weights, int top_k) -> Tensor");
  m.def("moe_weights_grad(Tensor a, Tensor b, Tensor inv, int top_k) -> Tensor");
  m.def("moe_route(Tensor ids, int num_experts) -> (Tensor, Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(cutlass_tune, CUDA, m) {
  m.impl("moe_gather", &move_rows<Direction::kGather>);
  m.impl("moe_combine", &move_rows<Direction::kCombine>);
  m.impl("moe_weights_grad", &moe_weights_grad);
  m.impl("moe_route", &moe_route);
}
