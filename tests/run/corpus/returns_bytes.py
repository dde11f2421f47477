"""A function that returns bytes (an image, a compressed blob), and one that returns what cannot travel.

Before: bytes raised UnicodeDecodeError locally, and on a pool killed the worker (and the next).
"""

import modal

app = modal.App("corpus-bytes")


@app.function()
def thumbnail(size: int) -> bytes:
    return bytes(range(250, 256)) * size  # not UTF-8: a PNG's first byte is 0x89


@app.function()
def handle():
    return object()  # no encoding carries it: the item fails with a TypeError saying what to do


@app.local_entrypoint()
def main():
    data = thumbnail.remote(2)
    print(type(data).__name__, len(data), data[:3])
    try:
        handle.remote()
    except TypeError as exc:
        print("TypeError:", str(exc).split(";")[0])
    print("after", [len(b) for b in thumbnail.map([1, 2, 3])])  # the pool still serves
