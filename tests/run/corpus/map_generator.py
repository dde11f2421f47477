""".map over a generator that is still producing while the first claims run."""

import time

import modal

app = modal.App("corpus-map-generator")


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


def numbers(n):
    for i in range(n):
        yield i * 10


@app.local_entrypoint()
def main(n: int = 25):
    total = 0
    for value in Model().double.map(numbers(n)):
        total += value
    print("total", total)
