"""End to end, the institution's front door on the booted estate (``estate.py``) with real munge:
``playbooks/site.yml`` with the institution inventory (its run's addresses in place of example.edu's)
installed munge with one key made on the controller, ``institution.yaml`` and the session service on
the session hosts and the broker on a front-door host (the site e2e shows a second run changes
nothing). Then researchers on a teaching host, with the same uids on every host, use ``--anywhere``
(their requests cross to the broker over TCP with munge, the broker's to the hosts likewise): two fill
every 1g.24gb slice of both RTX teaching hosts, a third is told what is busy, then queues and is
granted on a check-in (how soon is a figure written beside the logs, not a bound); an MPS slot comes
from the research host; forged, replayed, misdirected, changed and impersonating requests are
refused and audited by the broker; the broker killed with 20 queued requests comes back with its
queue intact and grants no slice twice; a user cannot cancel another's request; a stopped host
leaves the others serving and is back with its sessions; between labs, the one further below its
share goes first, whoever queued earlier, until the earlier request has waited the aging bound.
The calque.gpu.jupyterhub role's hub runs on the front door as the institution's hub user and its API
answers; teach-a (``calque_notebooks``) has ``jupyterhub-singleuser`` in its venv and session.yaml's
``notebook_*`` settings, teach-b (without) neither.
"""

from __future__ import annotations

import json
import subprocess
import time
from datetime import datetime
from typing import Any

import pytest
import yaml
from support import waits
from support.waits import HANG_S

from .estate import AGING, ALL, FRONT, H100, HUB_USER, LOGS, RESEARCH, TEACH_A, TEACH_B, Estate
from .fleet import Fleet

pytestmark = [pytest.mark.hosts, pytest.mark.slow]

PY = "/opt/calque/venv/bin/python"
AUDIT = "/var/log/calque/broker-audit.jsonl"
MPS_ANYWHERE = "session checkout --anywhere --mps --i-understand-shared-gpu-has-no-isolation --ttl 30m --json"

# A user's own process on a teaching host sending crafted requests to the broker (argv: the broker's
# name and address, a victim's user name): one JSON object of answers on stdout.
ATTACKS = r"""
import json, os, pwd, socket, sys
from calque.models.institution import binding
from calque.session import munge

name, address, victim = sys.argv[1:4]
me = pwd.getpwuid(os.getuid()).pw_name

def env(rid, host=name, user=me, args=None, cred=None):
    args = {} if args is None else args
    cred = cred or munge.encode(binding("queue", args, rid, host, user, None))
    return {"op": "queue", "args": args, "request_id": rid, "host": host, "user": user, "credential": cred}

def send(body):
    with socket.create_connection((address, 7460), timeout=20) as s:
        s.sendall(json.dumps(body).encode() + b"\n")
        data = b""
        while not data.count(b"\n"):
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    return json.loads(data.split(b"\n")[0])

out = {"forged": send(env("forged-0001", cred="MUNGE:" + "A" * 120 + ":"))}
ok = env("replay-0001")
out["first"], out["replayed"] = send(ok), send(ok)
out["other_host"] = send(env("otherhost-1", host="teach-b"))
changed = env("changed-001")
changed["args"] = {"all": True}
out["changed"] = send(changed)
out["other_user"] = send(env("victim-0001", user=victim))
print(json.dumps(out))
"""

# 20 waiting requests of one user, each on its own connection, left queued when the script exits.
QUEUE_20 = r"""
import sys, time
from calque.models.broker import AnywhereArgs
from calque.session.client.broker import BrokerClient
import threading

client = BrokerClient.here()
def wait(i):
    args = AnywhereArgs(profile="1g.24gb", ttl="1h", wait=True, request_id=f"r-dave-{i:02d}")
    try:
        client.call("anywhere", args.model_dump(mode="json"), wait=True)
    except Exception as exc:
        print(i, type(exc).__name__, flush=True)
for i in range(20):
    threading.Thread(target=wait, args=(i,), daemon=True).start()
    time.sleep(0.05)
# Ends once all 20 are queued (argv: a ceiling only a hang reaches), leaving them there.
mine = {f"r-dave-{i:02d}" for i in range(20)}
deadline = time.monotonic() + float(sys.argv[1])
while time.monotonic() < deadline and not mine <= {e.id for e in client.queue() if e.state == "queued"}:
    time.sleep(0.2)
"""


CANCEL_DAVES = r"""
from calque.session.client.broker import BrokerClient

client = BrokerClient.here()
for e in client.queue():
    if e.state == "queued":
        client.cancel(e.id)
"""


class Front:
    """The estate seen from the front door: users' commands on a teaching host, the broker's queue and audit."""

    def __init__(self, estate: Estate) -> None:
        self.fleet = estate.fleet

    def calque(self, user: str, args: str, check: bool = True, host: str = TEACH_A) -> subprocess.CompletedProcess[str]:
        return self.fleet.ssh(host, f"calque {args}", user=user, check=check)

    def json(self, user: str, args: str, host: str = TEACH_A) -> Any:
        return json.loads(self.calque(user, args, host=host).stdout)

    def queue_all(self) -> list[dict[str, Any]]:
        r = self.fleet.ssh(FRONT, "calque session queue --all --json", check=False)
        assert r.returncode == 0, r.stderr
        entries: list[dict[str, Any]] = json.loads(r.stdout)
        return entries

    def audit(self) -> list[dict[str, Any]]:
        out = self.fleet.ssh(FRONT, f"cat {AUDIT} 2>/dev/null || true").stdout
        return [json.loads(line) for line in out.splitlines() if line.strip()]


def wait_in_queue(f: Fleet, user: str, tag: str) -> None:
    """``user`` joins the queue from teach-a (``--wait`` in the background): the grant in /tmp/TAG.json,
    its time in /tmp/TAG.t."""
    f.ssh(
        TEACH_A,
        "nohup sh -c 'calque session checkout --anywhere --profile 1g.24gb --wait --ttl 1h --json "
        f">/tmp/{tag}.json 2>/tmp/{tag}.err; date +%s.%N >/tmp/{tag}.t' >/dev/null 2>&1 &",
        user=user,
    )


def until(what: str, check: Any, every: float = 0.5) -> Any:
    """``check()``'s first truthy answer: the event decides, only a hang (``HANG_S``) fails."""
    return waits.until(check, what, every=every)


def test_the_front_door_across_the_booted_estate(estate: Estate) -> None:
    front = Front(estate)
    f = front.fleet
    for host in ALL:  # one institution key, one institution file
        assert f.ssh(host, "systemctl is-active munge.service").stdout.strip() == "active"
        assert "broker:" in f.ssh(host, "cat /etc/calque/institution.yaml").stdout
    assert f.ssh(FRONT, "systemctl is-active calque-broker.service").stdout.strip() == "active"
    keys = {f.ssh(h, "sha256sum /etc/munge/munge.key").stdout.split()[0] for h in (TEACH_A, TEACH_B, FRONT)}
    assert len(keys) == 1

    # Two users fill every 1g slice of both teaching hosts from teach-a, through the broker over TCP.
    grants: list[dict[str, Any]] = []
    four = " && ".join(["calque session checkout --anywhere --profile 1g.24gb --ttl 1h --json"] * 4)
    for user in ("alice", "bob"):
        out = f.ssh(TEACH_A, four, user=user).stdout
        dec, i = json.JSONDecoder(), 0
        while i < len(out.strip()):
            g, i = dec.raw_decode(out, i)
            grants.append(g)
            while i < len(out) and out[i].isspace():
                i += 1
    assert len(grants) == 8, grants
    assert sorted(g["host"] for g in grants) == [TEACH_A] * 4 + [TEACH_B] * 4
    assert len({(g["host"], g["session"]["slice_id"]) for g in grants}) == 8
    busy = front.calque("carol", "session checkout --anywhere --profile 1g.24gb --ttl 1h", check=False)
    assert busy.returncode == 5 and TEACH_A in busy.stderr and TEACH_B in busy.stderr, busy.stderr
    # An MPS slot from the research host, as any user of teach-a asks for it.
    mps = front.json("carol", MPS_ANYWHERE)
    assert mps["host"] == RESEARCH

    # carol waits in the queue; alice checks one in; carol has it (how soon: a figure, not a bound).
    wait_in_queue(f, "carol", "carol")
    mine = until(
        "carol's request queued",
        lambda: [e for e in front.json("carol", "session queue --json") if e["state"] == "queued"],
    )
    assert mine[0]["user"] == "carol" and mine[0]["position"] == 1
    freed = grants[0]  # alice's are the first four
    ref = f"{freed['session']['id']}@{freed['host']}"
    t_free = float(front.calque("alice", f"session checkin {ref} >/dev/null && date +%s.%N").stdout)
    t_grant = float(until("carol's grant", lambda: f.ssh(TEACH_A, "cat /tmp/carol.t 2>/dev/null || :").stdout, 0.1))
    carol = json.loads(f.ssh(TEACH_A, "cat /tmp/carol.json").stdout)
    assert carol["host"] == freed["host"] and carol["session"]["slice_id"] == freed["session"]["slice_id"]
    (LOGS / "frontdoor-figures.txt").write_text(f"grant after a free (booted, over TCP): {t_grant - t_free:.3f} s\n")

    # Forged, replayed, for another host, body changed, naming another user: refused, one audit line each.
    res = json.loads(f.ssh(TEACH_A, f"{PY} - {FRONT} {f.host(FRONT).address} carol", user="dave", input=ATTACKS).stdout)
    assert res["first"]["ok"] is True
    refused = {k: v for k, v in res.items() if k != "first"}
    assert all(not v["ok"] and v["error"]["kind"] == "refused" for v in refused.values()), res
    reasons = [e["reason"] for e in front.audit()]
    assert reasons == ["credential_bad", "credential_replayed", "other_host", "payload_mismatch", "uid_mismatch"]

    # kill -9 of the broker with 20 queued requests: the queue is intact, no slice is granted twice.
    f.ssh(TEACH_A, f"{PY} - {HANG_S:g}", user="dave", input=QUEUE_20, timeout=HANG_S + 120)
    dave = {e["id"] for e in front.queue_all() if e["user"] == "dave" and e["state"] == "queued"}
    assert dave == {f"r-dave-{i:02d}" for i in range(20)}
    before = f.ssh(FRONT, "systemctl show -p MainPID --value calque-broker.service").stdout.strip()
    f.ssh(FRONT, "systemctl kill --signal=SIGKILL calque-broker.service")
    until(
        "the broker back",
        lambda: (
            f.ssh(FRONT, "systemctl show -p MainPID --value calque-broker.service").stdout.strip() not in ("0", before)
            and f.ssh(FRONT, "calque session queue --all --json", check=False).returncode == 0
        ),
    )
    after = {e["id"]: e for e in front.queue_all()}
    assert {i for i, e in after.items() if e["user"] == "dave" and e["state"] == "queued"} == dave
    cancel = front.calque("bob", "session queue --cancel r-dave-00", check=False)
    assert cancel.returncode == 4, cancel.stderr
    assert any(e["id"] == "r-dave-00" and e["state"] == "queued" for e in front.queue_all())  # bob changed nothing
    second_free = grants[1]
    front.calque("alice", f"session checkin {second_free['session']['id']}@{second_free['host']}")
    held = until(
        "one of dave's requests granted",
        lambda: [e for e in front.queue_all() if e["user"] == "dave" and e["session_id"]],
    )
    assert len(held) == 1 and held[0]["host"] == second_free["host"]
    views = front.json("root", "session list --all --json", host=FRONT)
    sessions = [st["session_id"] for v in views for st in v["slices"] if st.get("session_id")]
    assert len(sessions) == len(set(sessions)) and held[0]["session_id"] in sessions
    assert sum(1 for v in views for st in v["slices"] if st["busy"] and st["slice"]["profile"] == "1g.24gb") == 8

    # A host stopped: the others keep serving; its sessions are back when it returns.
    f.ssh(TEACH_A, f"{PY} -", user="dave", input=CANCEL_DAVES)
    assert not [e for e in front.queue_all() if e["user"] == "dave" and e["state"] == "queued"]
    # dave's granted request was never claimed (its client had gone): once the claim window (30 s) is
    # over, the broker gives the session back and, nobody waiting, the slice is free; dave takes it
    # directly, so that every 1g.24gb slice is held again (a slice freed later would go to the queue).
    until("dave's unclaimed grant given back", lambda: not [e for e in front.queue_all() if e["user"] == "dave"], 1)
    again = front.json("dave", "session checkout --anywhere --profile 1g.24gb --ttl 1h --json")
    assert (again["host"], again["session"]["slice_id"]) == (second_free["host"], second_free["session"]["slice_id"])
    front.calque("carol", f"session checkin {mps['session']['id']}@{RESEARCH}")
    f.ssh(TEACH_B, "systemctl stop calque-session.service")
    until(
        "teach-b shown as not answering",
        lambda: "teach-b" in front.calque("alice", "session list --all", check=False).stderr,
    )
    mps2 = front.json("bob", MPS_ANYWHERE)
    assert mps2["host"] == RESEARCH
    f.ssh(TEACH_B, "systemctl start calque-session.service")
    on_b = {g["session"]["id"] for g in grants if g["host"] == TEACH_B and g["session"]["user"] == "alice"}
    until(
        "alice's teach-b sessions back",
        lambda: on_b <= {st["session_id"] for st in front.json("alice", "session status --all --json")},
        1.0,
    )

    # Fair share and aging, scripted. Every 1g slice is held; lab-a (alice, bob) has used far more
    # through the broker than lab-b (carol, dave). alice queues first, dave after her: dave goes first.
    def positions() -> dict[str, int]:
        return {e["user"]: e["position"] for e in front.queue_all() if e["state"] == "queued"}

    def two_queued() -> dict[str, int] | None:
        now = positions()
        return now if len(now) == 2 else None

    wait_in_queue(f, "alice", "fair-alice")
    until("alice queued", lambda: "alice" in positions())
    wait_in_queue(f, "dave", "fair-dave")
    order = until("alice and dave queued", two_queued)
    assert order == {"dave": 1, "alice": 2}, order  # lab-b is further below its share
    bobs = [g for g in grants if g["session"]["user"] == "bob"]
    front.calque("bob", f"session checkin {bobs[0]['session']['id']}@{bobs[0]['host']}")
    until("dave granted", lambda: f.ssh(TEACH_A, "cat /tmp/fair-dave.t 2>/dev/null || :").stdout, 0.2)
    assert json.loads(f.ssh(TEACH_A, "cat /tmp/fair-dave.json").stdout)["host"] == bobs[0]["host"]
    assert positions() == {"alice": 1}
    # carol (lab-b) queues behind alice and goes ahead of her: alice has not yet waited the aging bound.
    wait_in_queue(f, "carol", "fair-carol")
    order = until("carol queued", two_queued)
    alice_since = next(e["enqueued_at"] for e in front.queue_all() if e["user"] == "alice" and e["state"] == "queued")
    aged_at = datetime.fromisoformat(alice_since).timestamp() + AGING
    assert time.time() < aged_at and order == {"carol": 1, "alice": 2}, (aged_at - time.time(), order)
    # Aging: once alice has waited the bound, she is ahead of carol again, whatever the labs' usage.
    time.sleep(max(0.0, aged_at - time.time()))
    seen: list[dict[str, int]] = []
    until("alice aged ahead of carol", lambda: seen.append(positions()) or seen[-1] == {"alice": 1, "carol": 2})
    bobs_next = bobs[1]
    front.calque("bob", f"session checkin {bobs_next['session']['id']}@{bobs_next['host']}")
    until("alice granted", lambda: f.ssh(TEACH_A, "cat /tmp/fair-alice.t 2>/dev/null || :").stdout, 0.2)
    assert json.loads(f.ssh(TEACH_A, "cat /tmp/fair-alice.json").stdout)["host"] == bobs_next["host"]
    assert positions() == {"carol": 1}


def test_one_reservation_occurrence_end_to_end(estate: Estate) -> None:
    """Issue 38 on the booted estate: root on the front door reserves 2 of the H100 host's 1g.10gb
    slices for lab-a, starting in a few seconds; alice (of lab-a) checks out on that host with
    ``--reservation`` during the window: through the queue, under it, her session ending with the
    window; the slice nobody used is held, then handed back after the release delay (the broker's
    ``reservations`` and ``list --all`` say so)."""
    f = estate.fleet
    name = "lab-a-e2e"
    # The window is long (nothing waits for its end: the reservation is cancelled after) so that a loaded
    # machine's slow steps never outlast it; it starts soon, and the early refusal is checked only when the
    # call returned before the start (then the broker answered it before the start too).
    start_in, release_s = 20, 10
    at = datetime.fromtimestamp(time.time() + start_in).astimezone().isoformat()
    made = f.ssh(
        FRONT,
        f"calque session reserve --name {name} --group lab-a --profile 1g.10gb --count 2 --at {at} "
        f"--for 10m --release-unused-after {release_s}s --json",
    )
    occurrence = json.loads(made.stdout)["occurrences"][0]
    start, end = (datetime.fromisoformat(t).timestamp() for t in occurrence)
    try:
        early = f.ssh(H100, f"calque session checkout --reservation {name} --ttl 1h --json", user="alice", check=False)
        if time.time() < start:
            assert early.returncode == 4 and "not under way" in early.stderr, early.stderr
        elif early.returncode == 0:  # answered in the window after all: that session is hers under it; give it back
            f.ssh(H100, f"calque session checkin {json.loads(early.stdout)['id']}", user="alice", check=False)
        time.sleep(max(0.0, start - time.time()))  # the window opens on the broker's clock (this machine's)
        got = f.ssh(
            H100, f"calque session checkout --profile 1g.10gb --reservation {name} --ttl 1h --json", user="alice"
        )
        alice = json.loads(got.stdout)
        assert f"under reservation {name}" in got.stderr, got.stderr
        assert datetime.fromisoformat(alice["expires_at"]).timestamp() <= end + 1.5, (alice, end)

        def now() -> dict[str, Any]:
            views = json.loads(f.ssh(FRONT, "calque session reservations --json").stdout)
            state: dict[str, Any] = next(v["now"] for v in views if v["reservation"]["name"] == name)
            return state

        seen = now()
        if time.time() < start + release_s - 1:  # a loaded machine may already be past the release
            assert (seen["used"], seen["held"], seen["handed_back"]) == (1, 1, 0), seen
        back = until("the unused slice handed back", lambda: (s := now())["handed_back"] == 1 and s)
        assert (back["used"], back["held"]) == (1, 0), back
        assert time.time() >= start + release_s - 1.5
        assert f"{name} now" in (listed := f.ssh(FRONT, "calque session list --all").stdout), listed
        assert "1 handed back" in listed
        f.ssh(H100, f"calque session checkin {alice['id']}", user="alice")
    finally:
        f.ssh(FRONT, f"calque session reservations --cancel {name}", check=False)


# The hub's REST API root answers anyone with its version; the image has no curl, so the host's Python asks.
HUB_API = "python3 -c 'import urllib.request; print(urllib.request.urlopen(\"http://127.0.0.1:8000/hub/api\").read().decode())'"
SINGLEUSER = "/opt/calque/venv/bin/jupyterhub-singleuser"


def test_the_hub_on_the_front_door_and_the_single_user_server_on_a_notebook_host(estate: Estate) -> None:
    f = estate.fleet
    assert f.ssh(FRONT, "systemctl is-active jupyterhub.service").stdout.strip() == "active"
    assert f.ssh(FRONT, "systemctl show --property=User --value jupyterhub.service").stdout.strip() == HUB_USER
    # The hub's API through the Python configurable-http-proxy on the bound address (it may still be starting).
    answer = until("the hub's API answers through its proxy", lambda: f.ssh(FRONT, HUB_API, check=False).stdout)
    assert json.loads(answer)["version"] == f.ssh(FRONT, "/opt/calque/venv/bin/jupyterhub --version").stdout.strip()
    config = f.ssh(FRONT, "cat /etc/jupyterhub/jupyterhub_config.py").stdout
    assert 'c.JupyterHub.spawner_class = "calque"' in config and 'c.JupyterHub.authenticator_class = "pam"' in config
    # teach-a runs notebooks: the single-user server in the runtime's venv, and the daemon's notebook_* settings.
    assert f.ssh(TEACH_A, f"{SINGLEUSER} --version").stdout.strip()
    session = yaml.safe_load(f.ssh(TEACH_A, "cat /etc/calque/session.yaml").stdout)
    assert session["notebook_command"][0] == SINGLEUSER
    assert session["notebook_ip"] == f.host(TEACH_A).address
    # teach-b does not: no notebooks extra and the daemon's defaults.
    assert f.ssh(TEACH_B, f"test -e {SINGLEUSER}", check=False).returncode == 1
    assert "notebook_command" not in yaml.safe_load(f.ssh(TEACH_B, "cat /etc/calque/session.yaml").stdout)
