// Kernel family 00 of tinyinfer.
#include "common.cuh"

TINYINFER_KERNEL(0)
