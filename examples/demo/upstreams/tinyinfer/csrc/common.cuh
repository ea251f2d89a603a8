#pragma once
#include <cuda_runtime.h>

#ifndef TINYINFER_VARIANTS
#define TINYINFER_VARIANTS 1
#endif

namespace tinyinfer {
// A templated kernel: each instantiation unrolls a different amount of work, so the
// number of instantiations (TINYINFER_VARIANTS) sets how long a file takes to compile.
template <int K, int V>
__global__ void mix_kernel(float* x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float acc = x[i];
#pragma unroll
  for (int r = 0; r < 32 * (V + 1); ++r) acc = sinf(acc * 0.5f + static_cast<float>(K + r)) * expf(-acc);
  x[i] = acc;
}

template <int K, int V>
struct Instantiate {
  static int launch(float* x, int n) {
    mix_kernel<K, V><<<(n + 255) / 256, 256>>>(x, n);
    return Instantiate<K, V - 1>::launch(x, n) + 1;
  }
};
template <int K>
struct Instantiate<K, 0> {
  static int launch(float*, int) { return 0; }
};
}  // namespace tinyinfer

#define TINYINFER_KERNEL(K) \
  extern "C" int tinyinfer_kernel_##K(float* x, int n) { \
    return tinyinfer::Instantiate<K, TINYINFER_VARIANTS>::launch(x, n); \
  }
