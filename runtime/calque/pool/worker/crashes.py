"""Claims that end their workers: the witness's marks, and the verdict a later attempt reads from them.

Whatever a method does in Python fails its item or its claim (``calque.warm.supervisor``,
``Worker._run``), but a method can still end its process outright (``os._exit``, a segfault in C
code, the kernel's OOM killer), and SQS then hands the claim to the next worker, which it ends too.
Only the worker's witness (``calque.pool.worker.witness``), the parent process that outlives it, can tell
that apart from the whole worker being killed (``kill -9``, a spot reclaim, another process's
doing): it writes a ``CrashMark`` at ``runs/<run>/running/<claim>/<attempt>.json`` when, and only
when, its worker died while an item of that claim was running, naming the item and how it died.

So a claim that was prefetched, released, or running on a worker that vanished as a whole is never
marked: nothing says it did anything wrong, and it runs again (SQS's redrive, and the worker's
check of the queue's ``maxReceiveCount`` across re-sends, still bound it). A claim with two marks
ended two workers while its items ran: it is poisoned, naming the items, before it ends a third.
"""

from __future__ import annotations

import logging

from pydantic import ValidationError

from calque.aws.store import RunStore, parse_s3_uri
from calque.errors import CalqueError
from calque.models import ClaimRef
from calque.models.poolcrash import CrashMark

log = logging.getLogger("calque.pool.worker.loop")
DEATHS_TO_POISON = 2  # one death may be bad luck on the host; a second one running the same items is not
_MARK_BYTES = 64 * 1024


def marks_prefix(results_prefix: str, claim_id: str) -> str:
    return f"{results_prefix}running/{claim_id}/"


def mark_uri(results_prefix: str, claim_id: str, attempt: int) -> str:
    return f"{marks_prefix(results_prefix, claim_id)}{attempt:04d}.json"


def record_death(store: RunStore, results_prefix: str, mark: CrashMark) -> None:
    """The witness's one write: ``mark`` where the claim's later attempts look (best effort)."""
    uri = mark_uri(results_prefix, mark.claim_id, mark.attempt)
    try:
        store.put(uri, mark.model_dump_json().encode())
    except CalqueError as exc:  # without the mark the claim only runs again: the queue's limits still bound it
        log.warning("could not mark claim %s as having ended its worker: %s", mark.claim_id, exc)


def deaths(store: RunStore, ref: ClaimRef, attempt: int) -> list[CrashMark]:
    """The witnessed deaths of ``ref``'s attempts before ``attempt``, oldest first."""
    prefix = marks_prefix(ref.results_prefix, ref.claim_id)
    try:
        bucket, _ = parse_s3_uri(prefix)
        uris = [f"s3://{bucket}/{key}" for key in store.keys(prefix)]
    except CalqueError as exc:  # unreadable for now: run it (the queue's limits still bound it)
        log.info("could not list the marks of claim %s: %s", ref.claim_id, exc)
        return []
    found: list[CrashMark] = []
    for uri in sorted(uris):
        try:
            data = store.get(uri, _MARK_BYTES)
            mark = None if data is None else CrashMark.model_validate_json(data)
        except (CalqueError, ValidationError):  # a mark no witness wrote (an older worker's) is no evidence
            continue
        if mark is not None and mark.attempt < attempt:
            found.append(mark)
    return found


def verdict(store: RunStore, ref: ClaimRef, attempt: int, max_runs: int) -> str | None:
    """Why attempt ``attempt`` of ``ref`` must not run (its items ended workers), or None.

    ``max_runs`` is the pool's ``max_receive_count``: the attempts that may run, this one and every
    earlier one whose worker died running it.
    """
    if attempt < 2:  # a first delivery has no earlier attempt to speak against it
        return None
    seen = deaths(store, ref, attempt)
    if len(seen) < DEATHS_TO_POISON and len(seen) + 1 <= max_runs:
        return None
    items = sorted({i for mark in seen for i in mark.items})
    named = ", ".join(str(i) for i in items) or "?"
    noun = "item" if len(items) == 1 else "items"
    how = "; ".join(f"attempt {m.attempt} on worker {m.worker_id}: {m.cause}" for m in seen)
    if len(seen) >= DEATHS_TO_POISON:
        many = {2: "two", 3: "three"}.get(len(seen), str(len(seen)))
        head = f"this claim ended {many} workers while its {noun} {named} ran ({how})"
        tail = "it is not offered to a third"
    else:
        head = f"this claim's {noun} {named} ended a worker ({how})"
        tail = f"the pool's max_receive_count {max_runs} lets no more attempts run"
    return f"{head}; {tail}. Run {noun} {named} with calque run --local to see why"
