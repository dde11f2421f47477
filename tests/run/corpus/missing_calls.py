"""Modal calls the guide uses to wait on spawned work: FunctionCall.gather, from_id, .spawn_map.

Before: modal.FunctionCall.gather raised "not supported"; from_id and .spawn_map were absent.
"""

import modal

app = modal.App("corpus-missing-calls")


@app.function()
def square(x: int) -> int:
    return x * x


@app.function()
def where() -> bool:
    return modal.is_local()


@app.local_entrypoint()
def main():
    calls = [square.spawn(x) for x in range(4)]
    print("gathered", modal.FunctionCall.gather(*calls))
    again = modal.FunctionCall.from_id(calls[2].object_id)
    print("from_id", again.get(timeout=120), again.object_id == calls[2].object_id)
    print("spawn_map", square.spawn_map([5, 6, 7]))
    print("is_local here", modal.is_local(), "remotely", where.remote())


@app.local_entrypoint()
def spawn_only():
    print("call", square.spawn(9).object_id)


@app.local_entrypoint()
def fetch(call_id: str):
    print("fetched", modal.FunctionCall.from_id(call_id).get(timeout=120))
