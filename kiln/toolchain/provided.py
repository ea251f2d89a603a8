"""Libraries a CUDA wheel links against that its users' machines provide, so that a wheel
must never carry a copy: torch's (``libtorch*``, ``libc10*``, ``libshm``), the CUDA
driver and runtime libraries (the driver's ``libcuda``; the rest from torch's
``nvidia-*`` wheels or the CUDA install), NCCL and NVSHMEM. ``auditwheel repair``
excludes them (a grafted second ``libcudart`` next to torch's breaks at run time), and
kiln's cibuildwheel check asks for the same list."""

from __future__ import annotations

PROVIDED_AT_RUN_TIME = (
    "libtorch*",
    "libc10*",
    "libshm*",
    "libcuda*",
    "libcudart*",
    "libnvrtc*",
    "libcublas*",
    "libcusparse*",
    "libcufft*",
    "libcurand*",
    "libcusolver*",
    "libnvJitLink*",
    "libnccl*",
    "libnvshmem*",
)
