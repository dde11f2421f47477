"""A permission problem in any `calque` command is a sentence and an exit code, never a traceback.

Run as a real second user against a simulated host root laid out: reading it works (any user may
read GPUs, as with nvidia-smi), changing it is refused (exit 4) saying to run it as root, and a file
the user may not create is the CLI root's one sentence.
"""

from __future__ import annotations

from collections.abc import Callable

import yaml

from .conftest import Host, User


def test_a_user_reads_roots_simulated_host_and_is_refused_changing_it(
    host: Host, make_user: Callable[..., User]
) -> None:
    bob = make_user()
    sim = ["--gpu-backend", "sim", "--sim-state", str(host.sim.state_path)]
    host.sim.gpus()  # root has taken the state's lock once: its lock file is root's
    info = host.cli(bob, "gpu", "info", *sim)
    assert info.returncode == 0, info.stderr
    assert "A100-40GB" in info.stdout and "Traceback" not in info.stderr

    layout = host.dir / "whole.yaml"
    whole = {"devices": [0], "mig-enabled": True, "mig-devices": {"7g.40gb": 1}}
    layout.write_text(yaml.safe_dump({"version": 1, "mig-configs": {"whole": [whole]}}))
    layout.chmod(0o644)
    apply = host.cli(bob, "gpu", "mig", "apply", "--config", str(layout), *sim, "--session-socket", "/nonexistent")
    assert apply.returncode == 4, apply.stderr
    assert "Traceback" not in apply.stderr
    assert "calque: error: cannot change the simulated GPU host" in apply.stderr and "as root" in apply.stderr
    assert len(host.sim.mig_devices()) == 7  # nothing changed


def test_a_file_a_user_may_not_create_is_one_sentence_and_exit_4(host: Host, make_user: Callable[..., User]) -> None:
    bob = make_user()
    made = host.cli(bob, "gpu", "sim", "create", "--card", "L4-24GB", "--sim-state", "/root/calque-nope/gpus.json")
    assert made.returncode == 4, made.stderr
    assert "Traceback" not in made.stderr
    assert made.stderr.strip().startswith("calque: error: permission denied on /root/calque-nope")
    as_json = host.cli(
        bob, "gpu", "sim", "create", "--card", "L4-24GB", "--sim-state", "/root/calque-nope/g.json", "--json"
    )
    assert as_json.returncode == 4 and '"kind": "refused"' in as_json.stderr
