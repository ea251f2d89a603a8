// Kernel family 08 of tinyinfer.
#include "common.cuh"

TINYINFER_KERNEL(8)
