"""``calque gpu mig suggest``: a MIG layout for one host that follows the demand its registry recorded.

The history (``calque.models.mig_history``: MIG sessions and refused asks by profile) is replayed per
profile (``replay.py``) against any number of instances. Starting from the current layout, one GPU at
a time is given the valid layout of its card (the catalog's profile table and placement grid, as the
planner checks them) that most lowers the replayed refusals of the whole host, each weighed by the
compute slices it asked for (a refused 3g ask counts as three refused 1g asks: it is capacity
refused, not a head count); a GPU changes only when that strictly lowers them, so a history without
refusals changes nothing. Ties go to the layout that uses more of the card's compute slices, then to
the one closest to the current (fewer instances made and destroyed). Capacity is counted in slices
(a GPU instance split into compute instances is that many). MIG is never turned on or off, and
unchanged GPUs keep their compute-instance splits: the planner then leaves their instances as they are.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import replace
from functools import lru_cache
from typing import Any

from calque.errors import UsageError
from calque.gpu.catalog import Card, load_catalog
from calque.gpu.layout import MIG_PARTED_VERSION, LayoutFile
from calque.gpu.migmodels import GpuMigState, GpuSuggestion, MigState, MigSuggestion, ProfileDemand
from calque.gpu.placement import place
from calque.gpu.replay import Ask, median, peak, refused
from calque.models.mig_history import History, Refusal, Use
from calque.timefmt import MINUTE, utc_moment, utc_text

CONFIG_NAME = "calque-suggested"
DEFAULT_SESSION_S = 3600.0  # a refused ask never granted, of a profile with no session to measure
ASSUMPTIONS = [
    "a refused ask that was granted later would have run as long as the session it got; one never granted, "
    "as long as the profile's median session (1 h where the profile has none)",
    "asks would not have changed with the layout; an ask for any MIG slice counts as one for the host's "
    "smallest profile",
    "one host, from its own registry: a request the broker granted here after it waited in the broker's "
    "queue counts from when it joined it; one the broker never granted anywhere (cancelled, timed out) is in "
    "no host's registry",
]


def _card(g: GpuMigState) -> Card | None:
    cat = load_catalog()
    card = cat.cards.get(g.card or "") or cat.find_card(g.name)
    return card if card is not None and card.mig else None


@lru_cache(maxsize=64)
def layouts(card_key: str, allowed: tuple[str, ...]) -> tuple[tuple[tuple[str, int], ...], ...]:
    """Every set of ``allowed`` GPU instances the card accepts (the planner's placement rules), as
    (profile, count) pairs; counts are searched depth first within the card's compute-slice, instance
    and per-profile bounds, so only the few sets that can fit are placed."""
    card = load_catalog().cards[card_key]
    profiles = [card.profile(n) for n in allowed]
    out: list[tuple[tuple[str, int], ...]] = []

    def walk(i: int, counts: list[int], slices: int, instances: int) -> None:
        if i == len(profiles):
            wanted = [p for n, p in zip(counts, profiles, strict=True) for _ in range(n)]
            if place(card, [], wanted) is not None:
                out.append(tuple((p.name, n) for n, p in zip(counts, profiles, strict=True) if n))
            return
        p = profiles[i]
        n = 0
        while n <= p.max_count and slices + n * p.compute_slices <= card.compute_slices:
            if instances + n > card.max_instances:
                break
            walk(i + 1, [*counts, n], slices + n * p.compute_slices, instances + n)
            n += 1

    walk(0, [], 0, 0)
    return tuple(out)


def _asks(history: History, offered: set[str]) -> tuple[dict[str, list[Ask]], list[str]]:
    """Each offered profile's asks: sessions granted at once, refusals (with the session a later try got)."""
    uses = {u.session_id: u for u in history.uses}

    def got(r: Refusal) -> Use | None:
        """The session a later try of ``r`` got, when it is of the profile ``r`` counts for (an ask for
        any slice may have got a larger one: that session stays an ask of its own profile)."""
        u = uses.get(r.granted or "")
        return u if u is not None and u.profile == r.profile and r.profile in offered else None

    linked = {u.session_id for r in history.refusals if (u := got(r)) is not None}
    asks: dict[str, list[Ask]] = {}
    durations: dict[str, list[float]] = {}
    for u in history.uses:
        durations.setdefault(u.profile, []).append(u.end - u.start)
        if u.session_id not in linked:
            asks.setdefault(u.profile, []).append(Ask(u.start, u.end - u.start))
    medians = {p: median(d, DEFAULT_SESSION_S) for p, d in durations.items()}
    left_out: set[str] = set()
    for r in history.refusals:
        p = r.profile
        if p not in offered:
            left_out.add(p)
            continue
        later = got(r)
        if later is not None:
            ask = Ask(r.first_at, later.end - later.start, (later.start, later.end - later.start))
        else:
            ask = Ask(r.first_at, medians.get(p, DEFAULT_SESSION_S))
        asks.setdefault(p, []).append(ask)
    notes = [f"asks for {p}, which no MIG GPU of this host offers, are left out" for p in sorted(left_out)]
    return asks, notes


def _slices(g: GpuMigState) -> Counter[str]:
    out: Counter[str] = Counter()
    for gi in g.instances:
        out[gi.profile] += max(1, len(gi.compute_instances))
    return out


def _fmt(counts: Counter[str] | dict[str, int]) -> str:
    return " + ".join(f"{n}x {p}" for p, n in sorted(counts.items()) if n) or "no instances"


def _entry(g: GpuMigState, after: Counter[str], changed: bool) -> dict[str, Any]:
    """The mig-parted entry of one GPU; an unchanged GPU keeps its compute-instance splits (mig-parted's
    ``<C>c.<G>g...`` keys where a profile's GIs split alike, calque's ``compute-instances`` otherwise)."""
    entry: dict[str, Any] = {"devices": [g.index], "mig-enabled": True}
    devices: dict[str, int] = {}
    splits: dict[str, list[int]] = {}
    card = _card(g)
    if not changed and card is not None:
        by_profile: dict[str, list[list[int]]] = {}
        for gi in g.instances:
            whole = card.profile(gi.profile).compute_slices
            by_profile.setdefault(gi.profile, []).append(
                sorted(c.compute_slices for c in gi.compute_instances) or [whole]
            )
        for p, cis in sorted(by_profile.items()):
            whole = card.profile(p).compute_slices
            if all(c == [whole] for c in cis):
                devices[p] = len(cis)
            elif all(c == cis[0] for c in cis) and len(set(cis[0])) == 1:
                devices[f"{cis[0][0]}c.{p}"] = len(cis) * len(cis[0])
            else:
                devices[p], splits[p] = len(cis), cis[0]
    else:
        devices = {p: n for p, n in sorted(after.items()) if n}
    entry["mig-devices"] = devices
    if splits:
        entry["compute-instances"] = splits
    return entry


def suggest(state: MigState, history: History, host: str) -> MigSuggestion:
    """The suggestion for ``state`` (the host's current layout) from ``history``; see the module's doc."""
    mig = [(g, card) for g in state.gpus if g.mig_current and (card := _card(g)) is not None]
    if not mig:
        raise UsageError(
            "this host has no GPU in MIG mode: there is no MIG layout to suggest (MPS hosts share whole GPUs)"
        )
    # slices a user can check out, by profile: a GPU instance split into compute instances is that many
    now = {g.index: _slices(g) for g, _ in mig}
    sizes = {p.name: (p.compute_slices, p.memory_slices, p.name) for _, c in mig for p in c.profiles}
    present = {p for c in now.values() for p in c} & set(sizes)
    smallest = min(present or sizes, key=sizes.__getitem__)
    # an ask for any MIG slice is one for the smallest profile (what a person would give it)
    history = replace(history, refusals=[replace(r, profile=r.profile or smallest) for r in history.refusals])
    asks, notes = _asks(history, set(sizes))
    memo: dict[tuple[str, int], int] = {}
    # with as many instances as the asks ever ran at once, all admitted at their first try, none is refused
    enough = {p: peak([(x.at, x.at + x.duration) for x in a]) for p, a in asks.items()}

    def f(p: str, n: int) -> int:
        if n >= enough.get(p, 0):
            return 0
        if (p, n) not in memo:
            memo[p, n] = refused(asks[p], n)
        return memo[p, n]

    def total(counts: Counter[str]) -> int:  # slices refused: a refused 3g ask weighs three 1g ones
        return sum(sizes[p][0] * f(p, counts[p]) for p in asks)

    after, changed = _climb(mig, now, {p for p, a in asks.items() if a}, total)
    return _suggestion(state, history, host, mig, now, after, changed, asks, f, notes)


def _climb(
    mig: list[tuple[GpuMigState, Card]],
    now: dict[int, Counter[str]],
    demanded: set[str],
    total: Callable[[Counter[str]], int],
) -> tuple[dict[int, Counter[str]], set[int]]:
    """One GPU at a time, the candidate layout that most lowers ``total`` over the host (each GPU
    changes at most once, and only for a strict improvement); the layouts and the GPUs changed."""
    after = {i: Counter(c) for i, c in now.items()}
    counts = sum(now.values(), Counter[str]())
    best_total, changed = total(counts), set()
    for _ in range(len(mig)):
        best: tuple[tuple[Any, ...], int, Counter[str]] | None = None
        for g, card in mig:
            if g.index in changed:
                continue
            allowed = tuple(sorted((demanded | set(now[g.index])) & {p.name for p in card.profiles}))
            for cand in layouts(card.key, allowed):
                c = Counter(dict(cand))
                if c == after[g.index]:
                    continue
                t = total(counts - after[g.index] + c)
                if t >= best_total:
                    continue
                used = sum(card.profile(p).compute_slices * n for p, n in c.items())
                moved = sum(((c - after[g.index]) + (after[g.index] - c)).values())
                key = (t, -used, moved, g.index, cand)
                if best is None or key < best[0]:
                    best = (key, g.index, c)
        if best is None:
            break
        (t, *_), i, c = best
        counts = counts - after[i] + c
        after[i], best_total = c, t
        changed.add(i)
    return after, changed


def _suggestion(
    state: MigState,
    history: History,
    host: str,
    mig: list[tuple[GpuMigState, Card]],
    now: dict[int, Counter[str]],
    after: dict[int, Counter[str]],
    changed: set[int],
    asks: dict[str, list[Ask]],
    f: Callable[[str, int], int],
    notes: list[str],
) -> MigSuggestion:
    hours = max(history.until - history.since, 0.0) / 3600
    host_now = sum(now.values(), Counter[str]())
    host_after = sum(after.values(), Counter[str]())
    profiles: list[ProfileDemand] = []
    for p in sorted(set(host_now) | set(host_after) | set(asks)):
        uses = [(max(u.start, history.since), min(u.end, history.until)) for u in history.uses if u.profile == p]
        used = sum(max(0.0, e - s) for s, e in uses) / 3600
        mine = [r for r in history.refusals if r.profile == p]
        profiles.append(
            ProfileDemand(
                profile=p,
                slices_now=host_now[p],
                slices_suggested=host_after[p],
                refused_asks=len(mine),
                waited_asks=sum(1 for r in mine if r.granted),
                peak_in_use=peak(uses),
                slice_hours_used=round(used, 2),
                slice_hours_idle=round(max(0.0, host_now[p] * hours - used), 2),
                replayed_refusals_now=f(p, host_now[p]),
                replayed_refusals_suggested=f(p, host_after[p]),
            )
        )
    gpus = [
        GpuSuggestion(
            index=g.index,
            card=c.key,
            mig_enabled=True,
            before=dict(now[g.index]),
            after=dict(after[g.index]),
            changed=g.index in changed,
        )
        for g, c in mig
    ]
    entries = [_entry(g, after[g.index], g.index in changed) for g, _ in mig]
    others = [g for g in state.gpus if not g.mig_current and _card(g) is not None]
    gpus += [
        GpuSuggestion(index=g.index, card=g.card, mig_enabled=False, before={}, after={}, changed=False) for g in others
    ]
    entries += [{"devices": [g.index], "mig-enabled": False} for g in others]
    entries.sort(key=lambda e: e["devices"][0])
    layout = {"version": MIG_PARTED_VERSION, "mig-configs": {CONFIG_NAME: entries}}
    LayoutFile.model_validate(layout)  # the planner's own reader accepts what is suggested
    before_total = sum(x.replayed_refusals_now for x in profiles)
    after_total = sum(x.replayed_refusals_suggested for x in profiles)
    reasons = _reasons(history, profiles, gpus)
    return MigSuggestion(
        host=host,
        registry=history.path,
        since=utc_moment(history.since),
        until=utc_moment(history.until),
        refusals_recorded_since=utc_moment(history.recorded_since) if history.recorded_since is not None else None,
        changed=bool(changed),
        refusals_avoided=before_total - after_total,
        gpus=gpus,
        profiles=profiles,
        reasons=reasons + notes,
        assumptions=list(ASSUMPTIONS),
        layout=layout,
    )


def _reasons(history: History, profiles: Iterable[ProfileDemand], gpus: list[GpuSuggestion]) -> list[str]:
    out: list[str] = []
    if history.recorded_since is not None and history.recorded_since > history.since:
        out.append(
            f"refusals are recorded since {utc_text(history.recorded_since, MINUTE)} only (the registry's schema 5)"
        )
    ps = list(profiles)
    if not history.refusals:
        out.append(
            f"no checkout of a MIG slice was refused between {utc_text(history.refusals_known_from, MINUTE)} and "
            f"{utc_text(history.until, MINUTE)}: the current layout stays"
        )
        return out
    changed = [g for g in gpus if g.changed]
    if not changed:
        out.append(
            f"{len(history.refusals)} asks were refused, but no valid layout of this host's GPUs refuses fewer when "
            "the history is replayed (the profiles they would take slices from were in use then): the layout stays"
        )
    for g in changed:
        out.append(f"GPU {g.index} ({g.card}): {_fmt(g.before)} -> {_fmt(g.after)}")
    for p in ps:
        if p.slices_suggested > p.slices_now:
            out.append(
                f"{p.profile} gains {p.slices_suggested - p.slices_now} slice(s): {p.refused_asks} asks refused "
                f"({p.waited_asks} of them waited), at most {p.peak_in_use} of {p.slices_now} in use at once; "
                f"replayed refusals {p.replayed_refusals_now} -> {p.replayed_refusals_suggested}"
            )
        elif p.slices_suggested < p.slices_now:
            more = p.replayed_refusals_suggested - p.replayed_refusals_now
            out.append(
                f"{p.profile} loses {p.slices_now - p.slices_suggested} slice(s): at most {p.peak_in_use} of "
                f"{p.slices_now} in use at once, {p.slice_hours_idle:g} of "
                f"{p.slice_hours_idle + p.slice_hours_used:g} slice-hours idle; "
                + (
                    f"{more} of its asks would have been refused"
                    if more > 0
                    else "none of its asks would have been refused"
                )
            )
    return out
