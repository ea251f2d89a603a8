// Kernel family 10 of tinyinfer.
#include "common.cuh"

TINYINFER_KERNEL(10)
