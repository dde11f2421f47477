""".remote in a loop, as Modal's hello-world example calls a function once per input."""

import time

import modal

app = modal.App("corpus-remote-loop")


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
    model = Model()
    for x in range(4):
        print("double", x, "->", model.double.remote(x))
    print(model.describe.remote("ab", repeat=3))
