"""Entrypoint arguments as modal run (1.5.4) parses them: Optional, X | None, Literal, and *args.

Before: Optional[int] and str | None were refused (exit 2), and def words(*argv) failed on a word
that starts with dashes.
"""

from typing import Literal, Optional

import modal

app = modal.App("corpus-modal-args")


@app.function()
def show(**kwargs):
    return sorted((k, type(v).__name__, v) for k, v in kwargs.items())


@app.local_entrypoint()
def main(
    seed: Optional[int] = None,  # noqa: UP045  (the spelling modal run must read, as Modal scripts write it)
    label: str | None = None,
    mode: Literal["fast", "slow"] = "fast",
    level: Literal[1, 2, 3] = 1,
    note=None,
):
    print(show.remote(seed=seed, label=label, mode=mode, level=level, note=note))


@app.local_entrypoint()
def words(*argv):
    print(show.remote(argv=argv))
