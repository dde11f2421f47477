"""An @enter that fails: the worker refuses to serve, and says why."""

import modal

app = modal.App("failing-enter")


@app.cls()
class Broken:
    @modal.enter()
    def load(self):
        raise RuntimeError("weights not found at /weights/model.bin")

    @modal.method()
    def go(self, x):
        return x
