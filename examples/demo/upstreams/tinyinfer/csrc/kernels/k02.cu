// Kernel family 02 of tinyinfer.
#include "common.cuh"

TINYINFER_KERNEL(2)
