"""The queue's order: FIFO inside a lab, between labs the one furthest below its share first, and
aging so that no request waits more than a bound behind later ones.

A pure function of the waiting requests, each lab's usage over the window and the labs' shares, so
the order a grant follows and the positions ``calque session queue`` shows are the same list.

A lab's usage is every session of its members on every host of the institution, however it was
granted (through the queue, on a host in degraded mode, an admin's ``--direct``): each host's own
record of its sessions (its ledger, as it last answered), and the broker's grants only where that
record cannot hold them yet (a host that never answered, a grant after its last answer).

A user in several labs is billed to the lab they name (``--lab``, one whose groups they are in), by
default the first lab in ``institution.yaml``'s order naming one of their groups: the queue, the
hosts' ledgers and the budgets read the same rule (``Institution.lab_of``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Waiting:
    """A queued request, as the order needs it."""

    id: str
    seq: int  # arrival order, from the store
    uid: int
    user: str
    lab: str
    kind: str
    profile: str | None
    ttl: float | None
    enqueued_at: float
    host: str | None = None  # asked on a host of the institution: only that host's slices will do
    reservation: str | None = None  # a member's, under a reservation under way: ahead of the queue
    gpu: int | None = None  # ``--gpu`` on its host (``host`` is set): only that GPU's slices will do

    def matches(self, kind: str, profile: str, host: str | None = None, gpu: int | None = None) -> bool:
        """Whether a free slice of ``kind``/``profile`` (on ``host``, on its GPU ``gpu``) would do for this request."""
        if self.host is not None and host is not None and host != self.host:
            return False
        if self.gpu is not None and gpu is not None and gpu != self.gpu:
            return False
        return self.kind == kind and (self.profile is None or self.profile == profile)


def order(
    waiting: Sequence[Waiting],
    usage: Mapping[str, float],
    shares: Mapping[str, float],
    *,
    now: float,
    aging: float,
    assumed_ttl: float,
    default_share: float = 1.0,
) -> list[Waiting]:
    """``waiting`` in the order grants follow.

    Requests that have waited ``aging`` seconds or more come first, oldest first: past the bound,
    arrival is all that counts. The rest are taken one at a time from the head of the lab whose usage
    (seconds over the window, ``usage``) divided by its share is lowest; each pick charges its lab the
    request's TTL (``assumed_ttl`` without one), so labs interleave in proportion to their shares
    instead of the lowest taking every slot. Ties go to the earlier arrival."""
    fifo = sorted(waiting, key=lambda w: w.seq)
    aged = [w for w in fifo if now - w.enqueued_at >= aging]
    taken = {w.id for w in aged}
    heads: dict[str, list[Waiting]] = {}
    for w in fifo:
        if w.id not in taken:
            heads.setdefault(w.lab, []).append(w)
    charged = {lab: usage.get(lab, 0.0) for lab in heads}
    out = list(aged)
    cursor = dict.fromkeys(heads, 0)
    while heads:
        lab = min(heads, key=lambda x: (charged[x] / shares.get(x, default_share), heads[x][cursor[x]].seq))
        w = heads[lab][cursor[lab]]
        out.append(w)
        charged[lab] += w.ttl if w.ttl is not None else assumed_ttl
        cursor[lab] += 1
        if cursor[lab] == len(heads[lab]):
            del heads[lab]
    return out


@dataclass(frozen=True)
class Span:
    """A session's stretch inside the window, for its lab: from a host's record or a broker grant."""

    lab: str
    host: str | None
    start: float
    end: float


def lab_usage(grants: Sequence[Span], recorded: Mapping[str, tuple[float, Sequence[Span]]]) -> dict[str, float]:
    """Seconds per lab: each host's record (``recorded``: host -> (when it answered, its spans)), and
    the broker's grants on a host without one, or the part of a grant after that host's answer."""
    out: dict[str, float] = {}
    for spans in recorded.values():
        for sp in spans[1]:
            out[sp.lab] = out.get(sp.lab, 0.0) + max(0.0, sp.end - sp.start)
    for g in grants:
        copy = recorded.get(g.host) if g.host is not None else None
        start = max(g.start, copy[0]) if copy is not None else g.start
        if g.end > start:
            out[g.lab] = out.get(g.lab, 0.0) + g.end - start
    return out


def lab_of(groups: frozenset[str], labs: Mapping[str, frozenset[str]]) -> str:
    """The lab a user queues for by default: the first lab, in institution.yaml's order (``labs``
    keeps it), one of whose Unix groups they are in; ``Institution.lab_of`` is the same rule."""
    for name, lab_groups in labs.items():
        if groups & lab_groups:
            return name
    return "default"


def chosen_lab(groups: frozenset[str], labs: Mapping[str, frozenset[str]], asked: str | None) -> str:
    """``--lab``: a lab whose groups the user is in; None: the default (``lab_of``)."""
    if asked is None:
        return lab_of(groups, labs)
    if asked not in labs:
        raise ValueError(f"no lab {asked} in the institution; labs: {', '.join(labs) or 'none'}")
    if not groups & labs[asked]:
        mine = [n for n, g in labs.items() if groups & g]
        raise ValueError(f"you are in none of lab {asked}'s groups; your labs: {', '.join(mine) or 'none'}")
    return asked
