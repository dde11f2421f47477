"""Generator methods consumed with .remote_gen, as Modal's streaming examples do (an LLM's tokens)."""

import os
import time

import modal

app = modal.App("corpus-streaming")


@app.cls()
class Streamer:
    @modal.enter()
    def load(self):
        self.vocab = ["alpha", "beta", "gamma"]

    @modal.method(is_generator=True)
    def tokens(self, n: int):
        for i in range(n):
            yield f"{self.vocab[i % 3]}-{i}"

    @modal.method()
    def countdown(self, n):  # no is_generator=True: a method that yields is a generator method all the same
        yield from range(n, 0, -1)

    @modal.method()
    def until_bad(self, n):
        for i in range(n):
            yield {"i": i}
        raise ValueError(f"no more after {n}")

    @modal.method()
    def handshake(self, marker: str):
        # The second value waits for the caller to have the first: a stream sent only at its end never gets one.
        yield "first"
        deadline = time.monotonic() + 300  # only a hang (tests/support/waits.py HANG_S) reaches it
        while not os.path.exists(marker):
            if time.monotonic() > deadline:
                raise TimeoutError("the caller never saw the first value while the method was still running")
            time.sleep(0.05)
        yield "second"


@app.local_entrypoint()
def main(n: int = 5, marker: str = ""):
    print(list(Streamer().tokens.remote_gen(n)))
    for x in Streamer().countdown.remote_gen(3):
        print("count", x)
    got = []
    try:
        for x in Streamer().until_bad.remote_gen(4):
            got.append(x)
    except ValueError as exc:
        print("stream ended with", repr(exc), "after", got)
    if marker:
        for value in Streamer().handshake.remote_gen(marker):
            print("handshake", value)
            if value == "first":
                open(marker, "w").close()
