// Test-only kernels exporting the cutlass-tune C ABI, each failing in one way:
//   ct_fault   writes through a bogus pointer (an illegal address: the CUDA context is lost)
//   ct_hang    spins forever on a flag nobody sets
//   ct_corrupt writes a plausible but wrong output (every element 1.0, as bf16)
// cutlass_tune_args.h is cut from templates/gemm_sm90_unit.cu.j2 by the tests, so the struct
// and the ABI version are the ones the real kernels export.
#include <cstddef>
#include <cstdint>
#include <cuda_runtime.h>

#include "cutlass_tune_args.h"

namespace {

__device__ int never_set = 0;

__global__ void write_through_bogus_pointer(float* p) { *p = 1.0f; }

__global__ void spin_forever() {
  volatile int* flag = &never_set;
  while (*flag == 0) {
    __nanosleep(1000);
  }
}

__global__ void fill_bf16_ones(uint16_t* d, int64_t count) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count;
       i += int64_t(gridDim.x) * blockDim.x) {
    d[i] = 0x3F80;  // bf16 1.0
  }
}

int status_of_launch() { return cudaGetLastError() == cudaSuccess ? 0 : 7; /* kErrorInternal */ }

int launch_fault(const cutlass_tune_args&, cudaStream_t stream) {
  write_through_bogus_pointer<<<1, 1, 0, stream>>>(reinterpret_cast<float*>(0x10));
  return status_of_launch();
}

int launch_hang(const cutlass_tune_args&, cudaStream_t stream) {
  spin_forever<<<1, 1, 0, stream>>>();
  return status_of_launch();
}

int launch_corrupt(const cutlass_tune_args& args, cudaStream_t stream) {
  fill_bf16_ones<<<132, 256, 0, stream>>>(static_cast<uint16_t*>(args.d), args.m * args.n);
  return status_of_launch();
}

}  // namespace

extern "C" int cutlass_tune_abi_version() { return CUTLASS_TUNE_ABI; }

// The Gemm object of these kernels is a copy of the arguments given to initialize.
#define CT_EXPORT(NAME, LAUNCH)                                                                   \
  extern "C" int NAME##_shared_storage_bytes() { return 0; }                                      \
  extern "C" int NAME##_stages() { return 0; }                                                    \
  extern "C" int NAME##_mma_n() { return 0; }                                                     \
  extern "C" size_t NAME##_workspace_size(const cutlass_tune_args*) { return 0; }                 \
  extern "C" int NAME##_can_implement(const cutlass_tune_args*) { return 0; }                     \
  extern "C" void* NAME##_create() { return new cutlass_tune_args(); }                            \
  extern "C" void NAME##_destroy(void* gemm) { delete static_cast<cutlass_tune_args*>(gemm); }    \
  extern "C" int NAME##_initialize(void* gemm, const cutlass_tune_args* args, void*, void*) {     \
    *static_cast<cutlass_tune_args*>(gemm) = *args;                                               \
    return 0;                                                                                     \
  }                                                                                               \
  extern "C" int NAME##_run(void* gemm, void* stream) {                                           \
    return LAUNCH(*static_cast<cutlass_tune_args*>(gemm), static_cast<cudaStream_t>(stream));     \
  }

CT_EXPORT(ct_fault, launch_fault)
CT_EXPORT(ct_hang, launch_hang)
CT_EXPORT(ct_corrupt, launch_corrupt)
