"""A concurrent class: @modal.concurrent(max_inputs=4) runs sync methods on 4 threads."""

import threading
import time

import modal

app = modal.App("concurrent")


@app.cls()
@modal.concurrent(max_inputs=4)
class Fetcher:
    @modal.enter()
    def setup(self):
        self.lock = threading.Lock()
        self.active = 0
        self.peak = 0

    @modal.method()
    def fetch(self, x: int) -> int:
        with self.lock:
            self.active += 1
            self.peak = max(self.peak, self.active)
        time.sleep(0.05)
        with self.lock:
            self.active -= 1
        return x + 100

    @modal.method()
    def observed_peak(self) -> int:
        return self.peak
