// Kernel family 04 of tinyinfer.
#include "common.cuh"

TINYINFER_KERNEL(4)
