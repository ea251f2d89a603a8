// Kernel family 03 of tinyinfer.
#include "common.cuh"

TINYINFER_KERNEL(3)
