"""``calque.jupyterhub.CalqueSpawner`` driven as JupyterHub drives it (issue 36, part 1), against a real
broker and a real host daemon over TCP with real munge, created Unix users and the real
``jupyterhub-singleuser``: the form shows what is free, ``start()`` gets a slice for the user and her
server on it, a second user waits with her place in the queue as progress and gets the slice when the
first stops, ``poll()`` sees a session that ended elsewhere, and state survives a hub restart: a running
server's, and why the last one stopped (through JupyterHub's own ``User.stop`` and its database). The
form shows her lab's budget left, the broker's figure after her usage.

The hub itself is not run: its objects (``Hub``, ``Server``) are JupyterHub's own, its user a plain
record, and the one hub endpoint the single-user server calls at start (``/hub/api``, the version)
is answered by a stand-in on 127.0.0.1. The institution names root as the hub (the test's process).
"""

from __future__ import annotations

import asyncio
import http.server
import json
import logging
import re
import shutil
import subprocess
import threading
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from support.waits import HANG_S

from .conftest import LAB_A, LAB_B, User, wait_for
from .institution import Broker, institution, over_tcp
from .test_isolation import _gone, cgroup_parent  # noqa: F401 (a fixture)

pytest.importorskip("jupyterhub")
from calque.jupyterhub.announce import session_notices
from calque.jupyterhub.slices import HubCalls
from calque.jupyterhub.spawner import CalqueSpawner
from jupyterhub import orm
from jupyterhub.objects import Hub, Server
from jupyterhub.user import User as HubUser
from traitlets.config import Config

pytestmark = [pytest.mark.slow, pytest.mark.skipif(shutil.which("munged") is None, reason="munge is not installed")]


class _HubApi(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        import jupyterhub

        body = json.dumps({"version": jupyterhub.__version__}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a: Any) -> None:
        pass


@pytest.fixture
def hub_api() -> Iterator[Hub]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _HubApi)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield Hub(ip="127.0.0.1", port=server.server_address[1], base_url="/hub/")
    server.shutdown()


def _home(user: User) -> None:
    """Her home (jupyter keeps its runtime files there); removed with her."""
    import pwd

    home = Path(pwd.getpwnam(user.name).pw_dir)
    home.mkdir(parents=True, exist_ok=True)
    subprocess.run(["chown", f"{user.uid}:{user.gid}", str(home)], check=True)


def _log(user: User) -> str:
    """What her server wrote (its log is in her home: ``session/daemon/notebook.py``)."""
    import pwd

    logs = sorted((Path(pwd.getpwnam(user.name).pw_dir) / ".local/state/calque").glob("notebook-*.log"))
    return "\n".join(p.read_text()[-3000:] for p in logs) or "no server log"


def _settings(broker: Broker) -> dict[str, Any]:
    """``c.CalqueSpawner``, as the hub's config file sets it."""
    return {
        "institution": str(broker.dir / "institution.yaml"),
        "broker_socket": str(broker.socket),
        "munge_socket": str(broker.config["munge_socket"]),
        "max_ttl": "2h",
        "queue_poll": 0.2,
    }


def _spawner(broker: Broker, hub: Hub, user: User) -> CalqueSpawner:
    record = SimpleNamespace(name=user.name, escaped_name=user.name, url=f"/user/{user.name}/", id=user.uid)
    sp = CalqueSpawner(
        user=record,
        hub=hub,
        api_token=f"token-{user.name}",
        oauth_client_id=f"jupyterhub-user-{user.name}",
        cookie_options={},
        **_settings(broker),
    )
    sp.server = Server(base_url=f"/user/{user.name}/")  # where the hub routes her: the server's prefix
    return sp


def _hub_user(broker: Broker, hub: Hub, name: str) -> HubUser:
    """``name`` as a hub (re)started on its database finds her: JupyterHub's own ``User``, its spawner
    made by the hub and loaded from the state the database holds (``User._new_spawner``)."""
    db = orm.new_session_factory(f"sqlite:///{broker.dir / 'jupyterhub.sqlite'}")()
    found = db.query(orm.User).filter_by(name=name).first()
    if found is None:
        found = orm.User(name=name)
        db.add(found)
        db.commit()
    config = Config({"CalqueSpawner": _settings(broker)})
    return HubUser(found, {"spawner_class": CalqueSpawner, "hub": hub, "config": config}, db=db)


LEFT = re.compile(r"Billed to lab <b>([^<]+)</b>: ([0-9.,]+) of its 0\.05 GPU-hours budget left for \d{4}-\d\d")


def _left(form: str) -> float | None:
    """Her lab's budget left, as the form shows it."""
    m = LEFT.search(form)
    return float(m.group(2).replace(",", "")) if m else None


def _used_by(broker: Broker, lab: str) -> float:
    """The lab's GPU-hours as the institution's report sums them (``calque report --institution``)."""
    res = broker.cli(None, "report", "--institution", "--by", "lab", "--since", "1d", "--json")
    assert res.returncode == 0, res.stderr
    return float(next(r["gpu_hours"] for r in json.loads(res.stdout)["rows"] if r["key"] == lab))


def _answers(ip: str, port: int, user: User) -> bool:
    try:
        with urllib.request.urlopen(f"http://{ip}:{port}/user/{user.name}/api", timeout=HANG_S) as r:
            return bool(r.status == 200 and "version" in json.loads(r.read()))
    except OSError:
        return False


def test_the_spawner_gets_her_a_slice_and_a_server_and_the_next_user_waits_her_turn(
    make_user: Callable[..., User],
    cgroup_parent: Path,  # noqa: F811
    hub_api: Hub,
) -> None:
    with institution(make_user, {"hostA": 1}) as broker:
        host = broker.hosts["hostA"]
        command = [*host.python, "-m", "jupyterhub.singleuser", "--ip={ip}", "--port={port}"]
        host.config.update(cgroups="direct", cgroup_parent=str(cgroup_parent), notebook_command=command)
        if "PYTHONPATH" in host.env:  # the users' python reaches the venv's packages through it
            host.config["notebook_env"] = {"PYTHONPATH": host.env["PYTHONPATH"]}
        # lab-a has a budget (0.05 GPU-h: 21 min of her 1/7 slice, a few seconds of it used here); lab-b none
        labs = [
            {"name": "lab-a", "groups": [LAB_A], "budget": {"gpu_hours": 0.05, "raised_by": "rc@example.edu"}},
            {"name": "lab-b", "groups": [LAB_B]},
        ]
        with over_tcp(broker, labs=labs, hub="root"):
            broker.config["ledger_every"] = 1.0  # the broker's budget round: the form's figure follows it
            broker.start()
            alice, bob = make_user([LAB_A]), make_user([LAB_B])
            _home(alice)
            _home(bob)
            asyncio.run(_story(broker, hub_api, host, alice, bob))


async def _story(broker: Broker, hub: Hub, host: Any, alice: User, bob: User) -> None:
    sa, sb = _spawner(broker, hub, alice), _spawner(broker, hub, bob)
    # The form: what is free now, her lab's budget (all of it left); a TTL past the hub's bound is refused.
    form = await sa.get_options_form()
    assert 'value="1g.5gb"' in form and "1 of 1 free" in form
    assert _left(form) == 0.05 and "until rc@example.edu raises it" in form, form
    assert "Billed to lab <b>lab-b</b>, which has no budget" in await sb.get_options_form()
    with pytest.raises(ValueError, match="at most 2h"):
        sa.options_from_form({"profile": ["1g.5gb"], "ttl": ["3h"]})
    sa.user_options = sa.options_from_form({"profile": ["1g.5gb"], "ttl": ["1h"]})
    sb.user_options = dict(sa.user_options)

    ip, port = await sa.start()
    assert await asyncio.to_thread(wait_for, lambda: _answers(ip, port, alice)), _log(alice)
    state = sa.get_state()
    assert state["host_name"] == "hostA" and state["session_id"].startswith("s-")
    [notebook] = [e for e in host.audit_events() if e["event"] == "notebook"]
    assert notebook["user"] == alice.name and notebook["session"] == state["session_id"]
    assert Path(f"/proc/{notebook['pid']}").stat().st_uid == alice.uid
    # The form now says none is free; a restarted hub finds her server from its state.
    assert "none free" in await sb.get_options_form()
    again = _spawner(broker, hub, alice)
    again.load_state(state)
    again.ip, again.port = ip, port
    assert await again.poll() is None

    # Bob waits in the queue, his place shown as progress; he gets the slice when she stops.
    starting = asyncio.ensure_future(sb.start())
    events: list[dict[str, Any]] = []

    async def watch() -> None:
        async for e in sb.progress():
            events.append(e)

    watching = asyncio.ensure_future(watch())
    placed = lambda: any("place 1" in e["message"] for e in events)  # noqa: E731
    while not placed() and not starting.done():
        await asyncio.sleep(0.1)  # the loop runs the spawner; the event decides
    assert placed(), events
    await sa.stop()
    assert await asyncio.to_thread(wait_for, lambda: _gone(notebook["pid"])), "her server outlived her stop"
    ip_b, port_b = await asyncio.wait_for(starting, HANG_S)
    await watching
    assert await asyncio.to_thread(wait_for, lambda: _answers(ip_b, port_b, bob))
    sb.ip, sb.port = ip_b, port_b
    said: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: said.append(record.getMessage())  # type: ignore[method-assign]
    sb.log.addHandler(handler)
    sb.warn_before = 7200  # his hour is within it: poll warns in the hub's log, once
    assert await sb.poll() is None and await sb.poll() is None
    assert [m for m in said if "ends at" in m and sb.session_id in m and "extend" in m] == said[-1:] and said

    # The hub keeps his running server in its database (what JupyterHub saves once a start returns);
    # its home page says, from the hub's poll, when his session ends and what keeps it.
    running = _hub_user(broker, hub, bob.name)
    running.spawner.orm_spawner.state = sb.get_state()
    running.db.commit()
    assert session_notices(running) == ""
    running.spawner.load_state(sb.get_state())
    running.spawner.warn_before = 7200
    assert await running.spawner.poll() is None
    notice = session_notices(running)
    assert notice.startswith(f'<span id="calque-notice">Your notebook: session {sb.session_id} on hostA ends')
    assert "(its time is up): `calque session extend --by 1h` in a notebook terminal" in notice, notice
    running.db.close()

    # His session ends without the hub (he checks it in himself): poll says the server is gone.
    assert sb.host_name is not None and sb.session_id is not None
    ended = sb.session_id
    HubCalls(Path(sb.institution), None, Path(sb.munge_socket)).checkin(bob.name, sb.host_name, sb.session_id)
    assert await sb.poll() == 0
    assert sb.last_end is not None and f"{sb.session_id} on hostA was checked in" in sb.last_end
    assert "was checked in" in await sb.get_options_form() and sb.get_state()["last_end"] == sb.last_end

    # The hub restarted meanwhile finds his server from its state, sees it gone and stops it (JupyterHub's
    # own User.stop: clear_state, then the state saved); restarted once more, his next form says why.
    hub_user = _hub_user(broker, hub, bob.name)
    assert hub_user.spawner.session_id == ended
    assert await hub_user.spawner.poll() == 0
    await hub_user.stop()
    hub_user.db.close()
    again = _hub_user(broker, hub, bob.name)
    assert again.spawner.session_id is None and again.spawner.host_name is None
    form = await again.spawner.get_options_form()
    assert f"Your last server stopped: session {ended} on hostA was checked in at " in form, form
    assert f"Your last server stopped: session {ended} on hostA was checked in" in session_notices(again)
    again.db.close()

    # Alice's lab's budget left after her session: the broker's round, as the institution's report sums it.
    used = _used_by(broker, "lab-a")
    assert used > 1e-4  # seconds of a 1/7 slice: a figure the form's four decimals show
    shown = lambda: _left(asyncio.run(sa.get_options_form()))  # noqa: E731
    assert await asyncio.to_thread(wait_for, lambda: abs((shown() or 1.0) - (0.05 - used)) < 5e-5), (used, shown())
