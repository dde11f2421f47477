"""Lab budgets at checkout, against a real daemon, as real Unix users in two labs' groups: a member
of a lab over its month's budget is refused (exit 4, naming the budget and who can raise it), a
member of a lab under it is not; a member cannot override; root's override is audited and lets the
lab check out again."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import yaml

from .conftest import LAB_A, LAB_B, Host, User

RAISED_BY = "Research Computing <rc@example.edu>"


def _institution(host: Host) -> str:
    path = host.dir / "institution.yaml"
    labs = [
        # 0.0002 GPU-h = 0.72 GPU-s: a few seconds on a 1/7 slice spend it
        {"name": "lab-a", "groups": [LAB_A], "budget": {"gpu_hours": 0.0002, "raised_by": RAISED_BY}},
        {"name": "lab-b", "groups": [LAB_B], "budget": {"usd": 1000}},
    ]
    path.write_text(yaml.safe_dump({"version": 1, "labs": labs}))
    path.chmod(0o644)
    return str(path)


def test_a_lab_over_its_budget_is_refused_and_a_lab_under_it_is_not(host: Host, make_user: Callable[..., User]) -> None:
    alice, bob = make_user([LAB_A]), make_user([LAB_B])
    host.start(institution=_institution(host))
    first = host.cli(alice, "session", "checkout", "--profile", "1g.5gb", "--json", check=True)
    assert json.loads(first.stdout)["user"] == alice.name  # under budget: granted
    time.sleep(6.0)  # 6 s x 1/7 GPU = 0.857 GPU-s, over lab-a's 0.72
    host.cli(alice, "session", "checkin", check=True)

    refused = host.cli(alice, "session", "checkout", "--profile", "1g.5gb")
    assert refused.returncode == 4, refused.stderr
    assert "lab lab-a has used" in refused.stderr and "0.0002 GPU-hours budget" in refused.stderr
    assert RAISED_BY in refused.stderr
    assert not [e for e in host.audit_events() if e["event"] == "checkout" and e["user"] == alice.name][1:]

    ok = host.cli(bob, "session", "checkout", "--profile", "1g.5gb", "--json")  # lab-b: far under its $1000
    assert ok.returncode == 0, ok.stderr

    status = json.loads(host.cli(None, "budget", "status", "--json", check=True).stdout)
    states = {s["lab"]: s["state"] for s in status}
    assert states == {"lab-a": "over", "lab-b": "ok"}

    mine = host.cli(alice, "budget", "override", "lab-a", "--extra", "1", "--reason", "mine")
    assert mine.returncode != 0 and "only root or the admin group" in mine.stderr
    granted = host.cli(None, "budget", "override", "lab-a", "--extra", "1", "--reason", "paper deadline", "--json")
    assert granted.returncode == 0, granted.stderr
    assert json.loads(granted.stdout)["state"] == "ok"
    (event,) = [e for e in host.audit_events() if e["event"] == "budget_override"]
    assert (event["lab"], event["extra"], event["reason"], event["by_uid"]) == ("lab-a", 1.0, "paper deadline", 0)
    again = host.cli(alice, "session", "checkout", "--profile", "1g.5gb", "--json")
    assert again.returncode == 0, again.stderr

    report = json.loads(host.cli(None, "report", "--by", "lab", "--since", "1d", "--json", check=True).stdout)
    labs = {r["key"]: r for r in report["rows"]}
    assert set(labs) == {"lab-a", "lab-b"} and labs["lab-a"]["events"] == 2
    assert labs["lab-a"]["ec2_usd"] > 0 and labs["lab-a"]["modal_usd"] > 0
    own = json.loads(host.cli(bob, "report", "--by", "user", "--json", check=True).stdout)
    assert [r["key"] for r in own["rows"]] == [bob.name]  # a member sees only their own usage

    # what labs used on other hosts is the broker's to say: a member who tries to zero lab-a's is refused
    forge = (
        "import sys; from calque.session.client.connection import SessionClient\n"
        "try:\n"
        "    zero = {'lab-a': {'gpu_hours': 0, 'usd': 0}}\n"
        "    SessionClient(sys.argv[1]).call('budget_elsewhere', month='2026-12', labs=zero)\n"
        "except Exception as exc:\n"
        "    print(type(exc).__name__, exc)"
    )
    out = host.run_as(alice, [*host.python, "-c", forge, str(host.socket)], check=True).stdout
    assert "only the institution's broker (or root)" in out, out
