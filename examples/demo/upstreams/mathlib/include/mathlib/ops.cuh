#pragma once
namespace mathlib {
__device__ __forceinline__ float fma_add(float a, float b, float alpha) { return a + alpha * b; }
}  // namespace mathlib
