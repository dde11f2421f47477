"""``pool.yml --check --diff`` predicts the real run that follows it, on the default runtime path.

The sandbox inventory stages the wheel and its wheelhouse (the default): check mode builds the wheel
locally and signs the URLs locally, so its user-data, and the config digest the group computes from
it, are the real run's. Each case runs check mode, then the real run, and compares what a person
reads: which tasks change, the config digest, what rolls, the desired count.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_pool_group_playbook import GROUP_TASK, SANDBOX_GROUP, in_group, play

SPEC_TASK = "Staged calque runtime and worker user-data"
SPEC_FILE_TASK = "Pool spec file (once the group took the spec)"
CHECK_ONLY = {"Does the pool bucket exist yet (check mode only)"}


def changed(tasks: dict[str, dict[str, Any]]) -> list[str]:
    return sorted(name for name, res in tasks.items() if res.get("changed") and name not in CHECK_ONLY)


def predicted_then_real(tmp_path: Path, **extra: Any) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    before = in_group()
    rc, check = play(tmp_path, "pool.yml", "--check", "--diff", **extra)
    assert rc == 0, check
    assert in_group() == before  # check mode launched and ended nothing
    rc, real = play(tmp_path, "pool.yml", **extra)
    assert rc == 0, real
    assert changed(check) == changed(real)
    predicted, done = check[GROUP_TASK], real[GROUP_TASK]
    assert predicted["config"] == done["config"]  # the digest the real run launched with
    assert predicted["desired"] == done["desired"]
    assert sorted(predicted["rolling"]) == sorted(done["rolling"])
    return check, real


@pytest.mark.slow
def test_check_diff_agrees_with_the_real_run_unchanged_new_spec_and_new_count(moto: str, tmp_path: Path) -> None:
    rc, first = play(tmp_path, "pool.yml")
    assert rc == 0, first
    staged = first[SPEC_TASK]["runtime"]
    assert staged["wheelhouse_key"] and staged["wheelhouse_sha256"]  # the default path: a wheelhouse is staged
    instances = in_group()

    # unchanged: check mode says nothing changes, no new digest, nothing rolls; and the real run agrees
    check, real = predicted_then_real(tmp_path)
    assert changed(check) == [] and check[GROUP_TASK]["rolling"] == []
    assert check[GROUP_TASK]["config"] == first[GROUP_TASK]["config"]
    assert check[SPEC_TASK]["runtime"]["wheelhouse_sha256"] == staged["wheelhouse_sha256"]
    assert in_group() == instances

    # a changed spec: the spec file and the template change, every instance rolls to the new digest
    spec = {"method": "embed", "parameters": {"dim": 16}, "workers": 1, "spot_watch": False, "shutdown_grace_s": 5}
    check, real = predicted_then_real(tmp_path, calque_pool_spec=spec)
    assert changed(check) == sorted([SPEC_FILE_TASK, GROUP_TASK])
    assert check[GROUP_TASK]["config"] != first[GROUP_TASK]["config"]
    assert sorted(check[GROUP_TASK]["rolling"]) == instances
    assert check[GROUP_TASK]["diff"]["after"]["config"] == real[GROUP_TASK]["config"]

    # a changed count: only the group changes, to 3, with no roll
    check, real = predicted_then_real(tmp_path, calque_pool_spec=spec, calque_pool_group={**SANDBOX_GROUP, "count": 3})
    assert changed(check) == [GROUP_TASK] and check[GROUP_TASK]["desired"] == 3 and check[GROUP_TASK]["rolling"] == []
    assert len(in_group()) == 3
