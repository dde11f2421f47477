"""An @exit hook that flushes state when the worker shuts down."""

import os

import modal

app = modal.App("exit-hook")


@app.cls()
class Counter:
    @modal.enter()
    def start(self):
        self.seen = 0

    @modal.method()
    def count(self, x):
        self.seen += 1
        print(f"counted {x}", flush=True)
        return self.seen

    @modal.exit()
    def flush(self):
        print(f"EXIT-HOOK-RAN seen={self.seen}", flush=True)
        marker = os.environ.get("CALQUE_TEST_EXIT_MARKER")
        if marker:
            with open(marker, "a") as f:
                f.write(f"exit seen={self.seen}\n")
