// Kernel family 05 of tinyinfer.
#include "common.cuh"

TINYINFER_KERNEL(5)
