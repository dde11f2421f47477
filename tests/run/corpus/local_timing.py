"""--local returns what a pool returns, as soon as it has it: is_local() in remote code, no trailing wait.

Before: under --local, modal.is_local() was True inside remote code, and every .map, .starmap and
.for_each returned about a second after its last result.
"""

import time

import modal

app = modal.App("corpus-local-timing")


@app.function()
def inside() -> bool:
    return modal.is_local()


@app.function()
def add(a: int, b: int) -> int:
    return a + b


@app.local_entrypoint()
def main(budget: float = 0.5):
    print("remote code is local:", inside.remote(), [inside.local()])
    slow = []
    for name, call in (
        ("map", lambda: list(add.map([1, 2], [3, 4]))),
        ("starmap", lambda: list(add.starmap([(1, 2)]))),
        ("for_each", lambda: add.for_each([1], [2])),
    ):
        started = time.monotonic()
        call()
        if time.monotonic() - started > budget:
            slow.append(name)
    print("slower than the budget:", slow if budget > 0 else "not timed")
