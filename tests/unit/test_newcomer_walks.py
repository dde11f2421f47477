"""The newcomer's walks of docs/architecture.md, held to the code: a claim from ``calque pool submit``
to its result, a worker's start, and a session from ``--anywhere`` to the host.

Each walk is a few legs, one per process (a hop over SQS, S3 or a socket joins them); a leg is a
call chain from where that process enters down to where the work is done, each module importing the
next (``support.house`` reads the imports, lazy and ``TYPE_CHECKING`` ones included). Going down a
leg, a newcomer enters each room at most once: no ``pool/`` -> ``cli/`` -> ``pool/`` detour, as the
worker's start through the CLI once was. Every module of a walk is named in docs/architecture.md.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from support import house

ROOT = Path(__file__).resolve().parents[2] / "runtime" / "calque"
DOC = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"

WALKS: dict[str, list[list[str]]] = {
    "a claim from `calque pool submit` to its result": [
        # the submitter: the items staged as claims on the pool's queue
        ["cli.pool_runs", "pool.submitter.runs", "pool.submitter.submit", "pool.submitter.stage", "aws.queue"],
        # a worker: the claim received, checked and held, its items run in the warm process
        ["pool.worker.loop", "pool.worker.intake", "pool.worker.lease"],
        ["pool.worker.loop", "pool.worker.claims", "warm", "warm.supervisor"],
        # its results and Summary written before the message is deleted
        ["pool.worker.loop", "pool.worker.writer", "pool.worker.summaries"],
        ["pool.worker.writer", "aws.store"],
        # the submitter again, in the same command: the Summaries folded into the run's report
        ["pool.submitter.runs", "pool.submitter.submit", "aws.store"],
    ],
    "a worker's start": [
        ["pool.worker.__main__", "pool.worker.entry", "pool.spec"],
        ["pool.worker.entry", "pool.worker.worker_process", "aws.imds"],
        ["pool.worker.worker_process", "warm.loader"],
        ["pool.worker.worker_process", "pool.worker.loop"],
    ],
    "a session from `--anywhere` to the host": [
        # the researcher's command: the broker's socket here, or institution.yaml's broker over TCP
        ["cli.session", "cli.session_front", "session.client.broker", "session.remote"],
        # the broker: read, queued, granted on a host with a free slice, reached as every host is
        ["session.broker.server", "session.broker.service", "session.broker.dispatch", "session.broker.grants"],
        ["session.broker.links", "session.remote"],
        # the host's daemon: the broker's munge credential checked, the checkout, the device nodes
        ["session.daemon.listener", "session.daemon.crosshost", "session.daemon.service", "session.daemon.checkout"],
        ["session.daemon.checkout", "session.daemon.nodes", "session.daemon.isolation"],
    ],
}


@pytest.fixture(scope="module")
def graph() -> tuple[dict[str, Path], dict[str, set[str]]]:
    modules = house.modules_of(ROOT)
    return modules, house.graph_of(modules)


def _rooms_entered(leg: list[str], modules: dict[str, Path]) -> list[str]:
    """The rooms a leg passes through, in order, a room counted again only when entered again."""
    rooms: list[str] = []
    for m in leg:
        room = house.room_of(m, modules)
        if not rooms or rooms[-1] != room:
            rooms.append(room)
    return rooms


def test_a_leg_that_leaves_a_room_and_comes_back_is_caught() -> None:
    modules = {
        "calque.pool.worker.entry": ROOT / "pool/worker/entry.py",
        "calque.cli.pool_worker": ROOT / "cli/pool_worker.py",
        "calque.pool.worker.loop": ROOT / "pool/worker/loop.py",
    }
    rooms = _rooms_entered(["calque.pool.worker.entry", "calque.cli.pool_worker", "calque.pool.worker.loop"], modules)
    assert rooms == ["calque.pool.worker", "calque.cli", "calque.pool.worker"]  # the check below refuses it
    assert len(set(rooms)) < len(rooms)


@pytest.mark.parametrize("walk", sorted(WALKS))
def test_each_walk_follows_the_imports_and_enters_each_room_once_a_leg(
    walk: str, graph: tuple[dict[str, Path], dict[str, set[str]]]
) -> None:
    modules, imports = graph
    for short in WALKS[walk]:
        leg = [f"calque.{m}" for m in short]
        missing = [m for m in leg if m not in modules]
        assert missing == [], f"{walk}: no such module {missing} (update the walk and docs/architecture.md)"
        broken = [(a, b) for a, b in itertools.pairwise(leg) if b not in imports[a]]
        assert broken == [], f"{walk}: these steps are not calls any more: {broken}"
        rooms = _rooms_entered(leg, modules)
        again = sorted({r for r in rooms if rooms.count(r) > 1})
        assert again == [], f"{walk}: the leg {short} enters {again} twice: {' -> '.join(rooms)}"


def test_docs_architecture_names_every_module_of_the_walks() -> None:
    doc = DOC.read_text()
    named = {m for legs in WALKS.values() for leg in legs for m in leg}
    paths = {m: m.replace(".", "/") + ("/" if (ROOT / m.replace(".", "/")).is_dir() else ".py") for m in named}
    absent = sorted(p for p in paths.values() if f"`{p}`" not in doc)
    assert absent == [], f"docs/architecture.md's walks do not name {absent}"
