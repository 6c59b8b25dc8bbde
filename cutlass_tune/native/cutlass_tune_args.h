// The C ABI's argument struct, as templates/gemm_sm90_unit.cu.j2 declares it for every kernel
// library (and cutlass_tune/kernel/_abi.py's GemmArgs mirrors it): the native operators fill a
// copy of a plan's template and hand it to S_initialize. tests/native/ checks the field offsets
// against GemmArgs.
#pragma once
#include <cstdint>

#ifndef CUTLASS_TUNE_ARGS_DEFINED
#define CUTLASS_TUNE_ARGS_DEFINED
struct cutlass_tune_args {
  int64_t m, n, k;
  const void* a;
  const void* b;
  const void* c;
  void* d;
  float alpha, beta;
  int32_t raster;
  int32_t swizzle;
  int32_t splits;
  int32_t decomposition;
  int32_t device_id;
  int32_t sm_count;
  const void* bias;
  const void* scale_a;
  const void* scale_b;
  int64_t groups;
  const void* offsets;
};
#endif

// The entry points of one kernel symbol S (cutlass_tune/kernel/_abi.py's ENTRY_POINTS).
typedef void* (*cutlass_tune_create_fn)();
typedef void (*cutlass_tune_destroy_fn)(void*);
typedef int (*cutlass_tune_initialize_fn)(void*, const cutlass_tune_args*, void*, void*);
typedef int (*cutlass_tune_run_fn)(void*, void*);
