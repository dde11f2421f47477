"""Entrypoint arguments of several types, parsed from the signature as modal run does."""

import time

import modal

app = modal.App("corpus-args")


@app.cls(gpu="L4", scaledown_window=300)
class Model:
    scale: int = modal.parameter(default=2)

    @modal.enter()
    def load(self):
        time.sleep(0.2)  # the "model load": paid once per worker
        self.weights = self.scale

    @modal.method()
    def double(self, x):
        return x * self.weights

    @modal.method()
    def add(self, a, b):
        return a + b

    @modal.method()
    def describe(self, text: str, repeat: int = 1) -> dict:
        return {"text": text * repeat, "length": len(text) * repeat}


@app.local_entrypoint()
def main(text: str, repeat: int = 2, factor: float = 0.5, loud: bool = False, max_items=3):
    result = Model().describe.remote(text.upper() if loud else text, repeat=repeat)
    print(result, factor * result["length"], type(max_items).__name__, max_items)
