"""vecadd: c = a + alpha * b on the GPU (kiln's bundled example extension)."""

import torch  # noqa: F401  (loads libc10/libtorch before the extension)

from vecadd import _C


def axpy(a, b, alpha=1.0):
    """a + alpha * b for float32 CUDA tensors of one shape."""
    return _C.axpy(a, b, float(alpha))
