"""A method that fails on some items: those fail alone, the claim goes on."""

import modal

app = modal.App("failing-items")


@app.cls()
class Checker:
    @modal.method()
    def sqrt(self, x: float) -> float:
        if x < 0:
            raise ValueError(f"negative input {x}")
        return x**0.5
