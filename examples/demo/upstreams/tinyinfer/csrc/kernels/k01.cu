// Kernel family 01 of tinyinfer.
#include "common.cuh"

TINYINFER_KERNEL(1)
