// Kernel family 07 of tinyinfer.
#include "common.cuh"

TINYINFER_KERNEL(7)
