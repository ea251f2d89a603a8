// Kernel family 06 of tinyinfer.
#include "common.cuh"

TINYINFER_KERNEL(6)
