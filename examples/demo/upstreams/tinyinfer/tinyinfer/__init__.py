"""tinyinfer: kiln's DeepInfer-shaped example (a package built in place)."""

from tinyinfer import _C

__version__ = "0.1.0"
kernel_count = _C.kernel_count
