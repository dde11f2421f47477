""".map over a list: results in input order, then as they finish (order_outputs=False)."""

import time

import modal

app = modal.App("corpus-map-list")


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
def main():
    inputs = list(range(23))
    print(list(Model().double.map(inputs)))
    print(sorted(Model().double.map(inputs, order_outputs=False)))
    print(list(Model().describe.map(["x", "yy"], kwargs={"repeat": 2})))
