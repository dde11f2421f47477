"""``checkout``: bind the caller to the first free slice that matches, within their limits.

The request's own rules (MPS or a profile, consent, a positive TTL) are ``CheckoutArgs``'s validators
(``calque.models.session``), checked by the client and again here on receipt; what is checked here
needs the host: the caller's limits, the slices there are, who holds what.
"""

from __future__ import annotations

import secrets
import time

from calque.durations import parse_duration
from calque.models.session import CheckoutArgs, Session, Slice
from calque.session.daemon import isolation
from calque.session.daemon.daemon_ledger import billed_lab, budget_gate, record_lab
from calque.session.daemon.demand import Ask
from calque.session.daemon.host import Host
from calque.session.daemon.identity import Caller, Identities
from calque.session.daemon.idle import idle_clock
from calque.session.daemon.nodes import grant
from calque.session.daemon.protection import protected
from calque.session.daemon.rows import AllDrained, Held, NoFreeSlice, TooManySessions
from calque.session.daemon.wire import RequestError
from calque.session.unix_groups import groups_of
from calque.timefmt import utc_moment, utc_text


def view(host: Host, held: Held) -> Session:
    """A session as its holder is told it: with the host's spot warning, its idle clock, and while an
    MPS slot's control daemon does not answer, why and what brings it back."""
    s = held.session.model_copy()
    s.spot = host.config.spot
    s.warnings = []
    policy = host.config.idle_policy
    if policy is not None:
        exempt = bool(policy.exempt_groups) and bool(set(policy.exempt_groups) & groups_of(s.user, s.gid))
        s.active_at, s.idle_ends_at = idle_clock(policy, held, exempt)
        s.idle_exempt = exempt
    if host.config.spot:
        s.warnings.append(
            "this host is a spot instance: an interruption ends every tenant's session without notice "
            "beyond the 2-minute spot warning; save your work often"
        )
    down = host.mps.unavailable(held.slice) if held.session.ended_at is None else None
    if down is not None:
        s.warnings.append(f"{down}; CUDA programs started now do not reach MPS (the session stays yours)")
    return s


def _ttl(host: Host, c: Caller, ids: Identities, args: CheckoutArgs) -> float:
    lim = ids.limits(c)
    assert lim.max_ttl is not None
    try:
        ttl = parse_duration(args.ttl if args.ttl is not None else host.config.default_ttl, what="ttl")
    except ValueError as exc:
        raise RequestError("usage", str(exc)) from exc
    if ttl <= 0:
        raise RequestError("usage", "--ttl must be positive, e.g. 30m or 2h")
    if ttl > lim.max_ttl:
        raise RequestError("refused", f"--ttl {ttl:g} s is more than your limit of {lim.max_ttl:g} s; ask for less")
    return ttl


def _candidates(host: Host, args: CheckoutArgs) -> list[Slice]:
    kind, profile, gpu = args.kind, args.profile, args.gpu
    all_slices = host.inventory.slices()
    cands = [s for s in all_slices if s.kind == kind]
    if profile:
        cands = [s for s in cands if s.profile == profile]
    if gpu is not None:
        cands = [s for s in cands if s.gpu_index == gpu]
    if not cands:
        have = sorted({f"{s.profile} (gpu {s.gpu_index})" for s in all_slices if s.kind == kind})
        raise RequestError(
            "usage",
            f"no {kind.upper()} slice on this host matches"
            + (f" profile {profile}" if profile else "")
            + (f" gpu {gpu}" if gpu is not None else "")
            + (f"; this host has: {', '.join(have)}" if have else _other_kind_hint(kind, all_slices)),
        )
    return cands


def _other_kind_hint(kind: str, all_slices: list[Slice]) -> str:
    """Where the host has none of the kind asked for: what it has instead, and how to ask for it."""
    if kind == "mig" and any(s.kind == "mps" for s in all_slices):
        return (
            "; this host has no MIG slices, only MPS slots: pass --mps "
            "--i-understand-shared-gpu-has-no-isolation (an MPS slot shares its GPU, with no memory isolation)"
        )
    if kind == "mps" and any(s.kind == "mig" for s in all_slices):
        profiles = sorted({s.profile for s in all_slices if s.kind == "mig"})
        return f"; this host has no MPS slots, only MIG slices: leave out --mps (or pass --profile {profiles[0]})"
    return f"; this host has no {kind.upper()} slices"


def _offered(host: Host, cands: list[Slice]) -> tuple[list[Slice], list[str]]:
    """The candidates whose MPS control daemon answers (every MIG slice), and, once per GPU, why the
    others are not offered."""
    up: list[Slice] = []
    down: dict[int, str] = {}
    for sl in cands:
        why = host.mps.unavailable(sl)
        if why is None:
            up.append(sl)
        else:
            down.setdefault(sl.gpu_index, why)
    return up, [down[g] for g in sorted(down)]


def checkout(host: Host, ids: Identities, c: Caller, args: CheckoutArgs, *, door: str = "direct") -> Session:
    ttl = _ttl(host, c, ids, args)
    lab = billed_lab(host, c, args.lab)  # --lab, checked against the caller's groups; else the default
    budget_gate(host, c, args.request_id, lab)  # a lab over its month's budget is refused (institution.yaml)
    # Slots whose daemon is down go to the registry as no candidate at all: a retried request still
    # gets its session, the caller's limits still apply, and the refusal below says why.
    cands, down = _offered(host, _candidates(host, args))
    now = time.time()
    sid = "s-" + secrets.token_hex(5)
    expires = utc_moment(now + ttl)
    lim = ids.limits(c)
    try:
        with protected(host.config):  # a fleet host: scale-in protection before the grant
            held, created = host.registry.checkout(
                cands,
                session_id=sid,
                uid=c.uid,
                gid=c.gid,
                user=c.user,
                now=now,
                ttl=ttl,
                max_sessions=lim.max_sessions,
                request_id=args.request_id,
                env_for=lambda s: isolation.environment(s, sid, expires),
                mps_one_user_per_daemon=host.config.mps_user_model == "serialised-per-user",
                group_limits=host.config.policy.group_limits(c.groups),
                ask=Ask(args.kind, args.profile or "", args.gpu, args.queued_since),
            )
    except TooManySessions as exc:
        if exc.group is not None:
            raise RequestError(
                "refused",
                f"group {exc.group} holds {exc.live} session(s) among its members, its limit is {exc.limit}; "
                "wait for one of them to check in",
            ) from exc
        raise RequestError(
            "refused",
            f"you hold {exc.live} session(s), your limit is {exc.limit}; check one in first "
            "(`calque session status` lists them)",
        ) from exc
    except AllDrained as exc:
        # The caller can do nothing about it here: a refusal (exit 4) saying who drained what and why.
        said = "; ".join(d.describe() for d in exc.drains)
        raise RequestError("refused", f"no new checkouts: {said}; try another host (or --anywhere)") from exc
    except NoFreeSlice as exc:
        if not cands:
            raise RequestError("refused", "no MPS slot can be offered now: " + "; ".join(down)) from exc
        raise RequestError("busy", _busy_message(exc, down)) from exc
    if created:
        record_lab(host, held.session.id, lab)
        grant(host, held, fresh=True)
        host.audit.record("checkout", held, pid=c.pid, door=door)  # door: broker, degraded, override ...
        host.timers_due.set()
        host.changed()
    elif held.session.ended_at is None:
        grant(host, held, fresh=False)  # a retried request: the first answer may have been lost in a crash
    return view(host, held)


def _busy_message(exc: NoFreeSlice, down: list[str]) -> str:
    busy = "; ".join(
        f"{h.slice.id} ({h.slice.profile}, gpu {h.slice.gpu_index}) until {utc_text(h.session.expires_at)}"
        for h in exc.busy
    )
    if exc.other_users:
        daemons = sorted({h.slice.pipe_directory or "" for h in exc.other_users})
        until = max(h.session.expires_at for h in exc.other_users)
        busy += ("; " if busy else "") + (
            f"free MPS slots on {', '.join(daemons)} are not offered to you while another user holds "
            f"slots there (MPS serialises different users' clients), until {utc_text(until)} at the latest"
        )
    busy += "".join(f"; not offered: {d}" for d in down)
    busy += "".join(f"; not offered: {d.describe()}" for d in exc.drains)
    return f"every matching slice is busy: {busy}; retry later or pass --wait"
