"""Plain @app.function()s: the claim names the function."""

import modal

app = modal.App("functions")


@app.function(gpu="any", retries=modal.Retries(max_retries=2), schedule=None)
def square(x: int) -> int:
    return x * x


@app.function()
async def shout(s: str) -> str:
    return s.upper()
