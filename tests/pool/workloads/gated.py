"""A workload whose items wait for a gate file (a pool parameter), so a test decides when they finish."""

import os
import time

import modal

app = modal.App("gated")


@app.cls()
class Gated:
    gate: str = modal.parameter(default="")
    tag: str = modal.parameter(default="")

    @modal.method()
    def work(self, x):
        deadline = time.monotonic() + 120
        while self.gate and not os.path.exists(self.gate) and time.monotonic() < deadline:
            time.sleep(0.02)
        return {"x": x, "by": self.tag}
