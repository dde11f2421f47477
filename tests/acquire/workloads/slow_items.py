"""A ramp workload: a measurable @enter, a method that can be slowed per item, an @exit marker file."""

import os
import time

import modal

app = modal.App("slow-items")


@app.cls()
class Slow:
    @modal.enter()
    def load(self):
        time.sleep(0.2)
        self.loads = int(os.environ.get("SLOW_LOADS", "0")) + 1

    @modal.method()
    def work(self, x, delay=0.0):
        time.sleep(delay)
        return {"x": x, "loads": self.loads}

    @modal.exit()
    def bye(self):
        marker = os.environ.get("SLOW_EXIT_MARKER")
        if marker:
            with open(marker, "a") as f:
                f.write("exit\n")
