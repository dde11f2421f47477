"""Remote exceptions: .map(return_exceptions=True) returns them in place; .remote raises the same type."""

import modal

app = modal.App("corpus-exceptions")


class LabError(Exception):
    pass


@app.function()
def square(x):
    if x == 3:
        raise ValueError(f"refusing {x}")
    if x == 5:
        raise LabError("the lab's own error type")
    return x * x


@app.local_entrypoint()
def main():
    out = list(square.map(range(7), return_exceptions=True))
    print([r if isinstance(r, int) else f"{type(r).__name__}: {r}" for r in out])
    try:
        square.remote(3)
    except ValueError as exc:
        print("caught ValueError:", exc)
    try:
        list(square.map([1, 5]))
    except Exception as exc:
        print("map raised", type(exc).__name__, exc)
    print("local", square.local(4))
