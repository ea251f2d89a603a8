"""kiln: reproducible builds of CUDA wheels from pinned upstream sources."""

__version__ = "0.1.0"
