"""Values of the types Modal users pass every day, as arguments and as results.

Before: a tuple came back a list, {1: ...} came back {'1': ...}, a datetime argument arrived as a
string (so day + timedelta failed remotely), and an object argument was not refused at the call.
"""

import datetime as dt
import math
from decimal import Decimal

import modal

app = modal.App("corpus-value-types")


@app.function()
def echo(value):
    return value


@app.function()
def next_day(day: dt.datetime, step: dt.timedelta) -> dt.datetime:
    return day + step


@app.function()
def describe(values):
    return {type(v).__name__ for v in values}, tuple(sorted(values, key=repr)[:1])


@app.local_entrypoint()
def main():
    sent = {
        "pair": (1, "a"),
        "ids": {3, 1, 2},
        "frozen": frozenset({"x"}),
        1: "an int key",
        (2, 3): "a tuple key",
        "blob": b"\x00\xff",
        "when": dt.datetime(2026, 12, 1, 9, 30, tzinfo=dt.timezone.utc),
        "day": dt.date(2026, 12, 1),
        "at": dt.time(9, 30),
        "price": Decimal("19.90"),
        "nested": [{"deep": (1.5, None, True)}],
        "$calque": "a key of its own",
    }
    back = echo.remote(sent)
    print(back == sent, sorted(type(v).__name__ for v in back.values()))
    print(sorted(map(repr, back)))
    odd = echo.remote([float("nan"), float("inf"), -float("inf")])
    print(math.isnan(odd[0]), odd[1:])
    print(next_day.remote(dt.datetime(2026, 12, 31, 23, 0), dt.timedelta(hours=2)))
    kinds, first = describe.remote([b"a", 2, 2.5])
    print(type(kinds).__name__, sorted(kinds), first)
    try:
        echo.remote(object())
    except TypeError as exc:
        print("TypeError at the call:", str(exc).split(";")[0])
