"""The pre-1.0 lifecycle: a constructor, __enter__ and __exit__ instead of decorators."""

import modal

stub = modal.Stub("dunders")


@stub.cls(gpu=modal.gpu.T4(), keep_warm=1, container_idle_timeout=120)
class Scaler:
    def __init__(self, scale: int = 2):
        self.scale = scale
        self.entered = False

    def __enter__(self):
        self.entered = True

    @modal.method()
    def apply(self, x: int) -> list:
        return [x * self.scale, self.entered]

    def __exit__(self, exc_type, exc, tb):
        print("DUNDER-EXIT-RAN", flush=True)
