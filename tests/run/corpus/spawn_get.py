""".spawn several calls, do other work, then .get each."""

import time

import modal

app = modal.App("corpus-spawn")


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
    calls = [Model().double.spawn(x) for x in (5, 6, 7)]
    print("spawned", len(calls))
    print([c.get(timeout=120) for c in calls])
