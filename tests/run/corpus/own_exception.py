"""The script's own exception class, raised remotely and caught by its class in the entrypoint.

Before: on a pool whose workload was staged to S3 it came back as RemoteError, so except missed it.
"""

import modal

app = modal.App("corpus-own-exception")


class QuotaExceeded(Exception):
    pass


@app.function()
def spend(amount: int) -> int:
    if amount > 10:
        raise QuotaExceeded(f"{amount} is over the lab's quota of 10")
    if amount < 0:
        raise KeyError("negative")
    return 10 - amount


@app.local_entrypoint()
def main():
    print("left", spend.remote(3))
    try:
        spend.remote(50)
    except QuotaExceeded as exc:
        print("caught QuotaExceeded:", exc, type(exc).__module__ == __name__)
    try:
        spend.remote(-1)
    except KeyError as exc:
        print("caught KeyError:", exc)
    out = list(spend.map([1, 20], return_exceptions=True))
    print([type(r).__name__ for r in out], isinstance(out[1], QuotaExceeded))
