"""calque: share institutional GPU capacity on AWS (warm pools, MIG slices, MPS slots)."""

__version__ = "0.1.0"
