"""An async entrypoint: .remote.aio gathered, .map.aio iterated."""

import asyncio
import time

import modal

app = modal.App("corpus-async")


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
async def main():
    model = Model()
    values = await asyncio.gather(*(model.double.remote.aio(x) for x in range(5)))
    print("gathered", values)
    seen = [v async for v in model.add.map.aio([1, 2], [3, 4])]
    print("mapped", seen)
