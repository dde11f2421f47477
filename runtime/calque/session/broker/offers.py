"""What the institution offers, said to the user who asked: a request no host could ever grant is
refused before it is queued (no such profile anywhere; asked on one host, no such slice there; with
``--gpu``, no such GPU on that host, or no such slice on it), and a request answered busy is told
what holds each matching slice, and which free ones are not offered (drained, MPS daemon down).

Both read the broker's cache of the hosts; a host not listed yet is no evidence either way (its own
checkout refuses what it cannot grant, and the request ends with its words: ``grants.py``)."""

from __future__ import annotations

from calque.errors import UsageError
from calque.session.broker.hosts import HostCache, matching
from calque.timefmt import utc_text


def check_offered(
    cache: HostCache, kind: str, profile: str | None, host: str | None = None, gpu: int | None = None
) -> None:
    """Refuse (``UsageError``) a request no host listed could grant: ``host`` its one host, ``gpu``
    that host's GPU index."""
    if host is not None and host not in cache.links:
        raise UsageError(f"no host {host} in the institution; hosts: {', '.join(cache.names)}")
    views = [v for v in cache.views() if v.seen_at is not None and host in (None, v.name)]
    if not views:
        return
    if gpu is not None:
        gpus = sorted({s.slice.gpu_index for v in views for s in v.slices})
        if gpu not in gpus:
            have = ", ".join(map(str, gpus)) or "none"
            why = f"{host} has no GPU {gpu} with slices to check out; its GPUs with slices: {have}"
            raise UsageError(why + " (`calque session list` shows them)")
    if not any(matching(v, kind, profile, gpu) for v in views):
        on = f" on GPU {gpu}" if gpu is not None else ""
        offer = sorted({f"{s.slice.profile} ({v.name}, gpu {s.slice.gpu_index})" for v in views for s in v.slices})
        what = f"{kind.upper()} slice" + (f" of profile {profile}" if profile else "") + on
        who = (
            f"{host} offers no {what}; it offers"
            if host is not None
            else f"no host of the institution offers a {what}; they offer"
        )
        raise UsageError(f"{who}: {', '.join(offer) or 'nothing'}")


def busy_message(
    cache: HostCache, kind: str, profile: str | None, queued: int, host: str | None = None, gpu: int | None = None
) -> str:
    """Why nothing was granted at once: each matching slice's holder and deadline (on ``host`` and
    its GPU ``gpu`` alone, for a request asked there), drains and unavailable slots each once."""
    parts = []
    any_drained = any_down = False
    for v in cache.views():
        if host is not None and v.name != host:
            continue
        if not v.reachable:
            parts.append(f"{v.name} does not answer")
            continue
        mine = matching(v, kind, profile, gpu)
        held = [s for s in mine if s.busy]
        held.sort(key=lambda s: s.busy_until.timestamp() if s.busy_until else float("inf"))
        parts += [f"{v.name}: {s.slice.id} ({s.slice.profile}) until {utc_text(s.busy_until, none='?')}" for s in held]
        # Free slices the broker routes around: each drain once, saying who drained it and why.
        drained = {s.drained.describe() for s in mine if s.drained and not s.busy}
        parts += [f"{v.name}: {d.replace('this host', v.name)}" for d in sorted(drained)]
        # MPS slots whose control daemon does not answer: offered to nobody, each reason once.
        down = {s.why_not or "its MPS daemon does not answer" for s in mine if s.unavailable}
        parts += [f"{v.name}: not offered: {d}" for d in sorted(down)]
        any_drained, any_down = any_drained or bool(drained), any_down or bool(down)
    ahead = f"; {queued} request(s) already queued for one" if queued else ""
    where = "; ".join(parts) or "no host listed yet"
    what = "busy" + (" or drained" if any_drained else "") + (" or unavailable" if any_down else "")
    on = f" on {host}" + (f" GPU {gpu}" if gpu is not None else "") if host is not None else ""
    return f"every matching slice{on} is {what}: {where}{ahead}; pass --wait to join the queue"
