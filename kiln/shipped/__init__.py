"""Stand-alone tools that kiln copies into a built tree (``.kiln/``) so they work on a
GPU node without kiln installed: standard library only, no imports from ``kiln``."""
