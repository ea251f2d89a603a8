// Kernel family 11 of tinyinfer.
#include "common.cuh"

TINYINFER_KERNEL(11)
