"""Imports under image.imports() run on the worker, as inside a Modal container."""

import modal

image = modal.Image.from_registry("nvidia/cuda:12.4.0-runtime-ubuntu22.04", add_python="3.11").pip_install("numpy")
app = modal.App("imports", image=image)

with image.imports():
    import statistics

if modal.is_local():
    raise RuntimeError("modal.is_local() must be False on a worker")


@app.cls(image=image)
class Stats:
    @modal.method()
    def mean(self, xs: list) -> float:
        return statistics.mean(xs)
