"""The pool tests' workload: a short @enter, a method with an optional delay, an @exit that reports."""

import os
import sys
import time

import modal

app = modal.App("steady")


@app.cls()
class Steady:
    @modal.enter()
    def load(self):
        time.sleep(float(os.environ.get("STEADY_ENTER_S", "0.2")))
        self.pid = os.getpid()

    @modal.method()
    def work(self, x, delay=0.0):
        print(f"start {x}", flush=True)
        time.sleep(delay * float(os.environ.get("STEADY_DELAY_SCALE", "1")))
        return {"x": x, "pid": self.pid}

    @modal.method()
    def other(self, x):
        return -x

    @modal.exit()
    def bye(self):
        print("STEADY-EXIT", flush=True)
        print("stderr from the script", file=sys.stderr, flush=True)
