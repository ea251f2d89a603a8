// Kernel family 09 of tinyinfer.
#include "common.cuh"

TINYINFER_KERNEL(9)
