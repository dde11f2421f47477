"""Which pool serves a class or function of the script: ``--pool SPEC``, or a small mapping file.

The mapping file (``--pools FILE``, default ``calque-run.yaml`` beside the script when it exists;
``calque-run.yml``, its name until 0.1, is read with a warning for one release: ``calque.confignames``)::

    version: 1
    pools:
      Embedder: ../pools/embedder-spec.yaml    # class or function name -> its pool's spec file
      generate: ../pools/llm-spec.yaml
      Translator: [../pools/translator-fr.yaml, ../pools/translator-en.yaml]  # one pool per parameter set

A spec file is the PoolSpec that ``playbooks/pool.yml`` writes (``calque_pool_spec_path``): it names
the pool's model (hence its queue), bucket, prefix, region, batch size and the class's parameters.
A class mapped to several spec files is served by the one whose parameter set is the call's (as
Modal's parameters pick a class's containers); a call no pool's set matches is refused, naming each
pool's differing fields. A name the mapping lacks goes to ``--pool``; with neither, the error says
how to create a pool. Nothing is ever launched.
"""

from __future__ import annotations

import contextlib
import threading
from pathlib import Path
from typing import Any

from pydantic import Field

from calque.aws.clients import client
from calque.configfile import load_model
from calque.confignames import config_path
from calque.errors import CalqueError, UsageError
from calque.models import CalqueModel, PoolSpec
from calque.pool.spec import load_spec
from calque.pool.submitter.deployed import deployed_spec
from calque.run.backend import Target
from calque.warm import modal_shim
from calque.warm.loader import coerce_parameter, parameter_set

DEFAULT_POOLS_FILE = "calque-run.yaml"


class RunPools(CalqueModel):
    """``calque-run.yaml``: which pool spec serves each class or function of a script."""

    version: int = 1
    pools: dict[str, str | list[str]] = Field(
        default_factory=dict,
        description="class or function name -> its pool's spec file, or the spec files of its pools, one per "
        "parameter set (a call goes to the pool whose parameters are the call's)",
    )


class PoolMap:
    """Resolves a target to its pool's spec, checking that the pool runs that target."""

    def __init__(self, script: Path, default_spec: str | None = None, pools_file: str | None = None) -> None:
        self.script = script
        self.default_spec = default_spec
        self.mapping: dict[str, list[Path]] = {}
        path = (
            Path(pools_file) if pools_file else config_path(script.parent / DEFAULT_POOLS_FILE, "calque run pools file")
        )
        self.pools_file = path
        if pools_file or path.is_file():
            doc = load_model(RunPools, path, "calque run pools file")
            self.mapping = {
                k: [path.parent / f for f in ([v] if isinstance(v, str) else v)] for k, v in doc.pools.items()
            }
        self._specs: dict[Path, PoolSpec] = {}
        self._by_name: dict[str, PoolSpec] = {}  # deployed pools found by name (Cls.from_name)
        self._lock = threading.Lock()

    def spec_for(self, target: Target) -> PoolSpec:
        if target.deployed is not None:
            return self._deployed_spec(target)
        paths = self.mapping.get(target.name) or ([Path(self.default_spec)] if self.default_spec else [])
        if not paths:
            raise UsageError(self._no_pool(target))
        refusals: list[str] = []
        for spec_path in paths:
            spec = self._load(spec_path)
            _refuse_other_function(target, spec, f"pool spec {spec_path}", f". {self._no_pool(target)}")
            wrong = _differences(target, spec)
            if not wrong:
                return spec  # the pool of this call's parameter set
            refusals.append(f"the pool of {spec_path} runs {target.name} with other parameters: {'; '.join(wrong)}")
        several = len(paths) > 1
        raise UsageError(
            f"{target.name}: {'. '.join(refusals)}. A pool serves one parameter set: call {target.name}(...) with "
            f"{'one pool' if several else 'the pool'}'s values, or map {target.name} in {self.pools_file.name} to "
            f"the spec of a pool that sets these parameters{' too' if several else ''} "
            f"(pools: {{{target.name}: [SPEC, ...]}}). Nothing was sent"
        )

    def _load(self, spec_path: Path) -> PoolSpec:
        with self._lock:
            spec = self._specs.get(spec_path)
            if spec is None:
                spec = self._specs[spec_path] = load_spec(spec_path)
            return spec

    def _deployed_spec(self, target: Target) -> PoolSpec:
        """``from_name(pool, name)``: the spec in the launch template of the group tagged with that pool."""
        assert target.deployed is not None
        with self._lock:
            spec = self._by_name.get(target.deployed)
            if spec is None:
                asg, ec2 = client("autoscaling"), client("ec2")
                spec = self._by_name[target.deployed] = deployed_spec(target.deployed, asg, ec2)
        _refuse_other_function(target, spec, f"deployed pool {target.deployed}")
        wrong = _differences(target, spec)
        if wrong:
            raise UsageError(
                f"{target.name}: the pool {target.deployed} runs {target.name} with other parameters: "
                f"{'; '.join(wrong)}. A pool serves one parameter set: call {target.name}(...) with the pool's "
                "values. Nothing was sent"
            )
        return spec

    def known_specs(self) -> list[PoolSpec]:
        """Every pool this script may call: the mapping's, then ``--pool``'s (a bad file is skipped)."""
        paths = [
            *(p for ps in self.mapping.values() for p in ps),
            *([Path(self.default_spec)] if self.default_spec else []),
        ]
        out: list[PoolSpec] = []
        for p in dict.fromkeys(paths):
            with contextlib.suppress(CalqueError):
                if p not in self._specs:
                    self._specs[p] = load_spec(p)
                out.append(self._specs[p])
        return out

    def _no_pool(self, target: Target) -> str:
        kind = "function" if target.is_function else "class"
        workload = f"{self.script}::{target.name}"
        return (
            f"no pool serves {kind} {target.name} of {self.script.name}. To create one, set in your inventory's "
            f"group_vars calque_pool_model (the pool's name), calque_pool_bucket and calque_pool_workload: "
            f"{workload}, then run `ansible-playbook -i INVENTORY playbooks/pool.yml`; it writes the pool's spec "
            f"to calque_pool_spec_path. Pass that file with --pool SPEC, or map it in {self.pools_file.name} "
            f"(pools: {{{target.name}: SPEC}}). To try the script with no pool: calque run --local {self.script.name}"
        )


def _refuse_other_function(target: Target, spec: PoolSpec, pool: str, more: str = "") -> None:
    """A pool whose workload names another function (``module::name``) never serves ``target``."""
    _, _, serves = spec.workload.partition("::")
    if serves and serves != target.name:
        raise UsageError(
            f"{target.label}: {pool} serves {serves!r} (workload {spec.workload}), not {target.name!r}{more}"
        )


def _differences(target: Target, spec: PoolSpec) -> list[str]:
    """Where a call's full parameter set differs from the one the pool runs (its spec's over the class's
    defaults), field by field; [] when the pool runs this call's set, as a Modal class's parameters
    pick its containers."""
    if target.is_function:
        return []
    # a deployed class (from_name) is not in this script: only the parameters given are compared
    klass = (
        None
        if target.deployed
        else next(
            (
                a.registered_classes[target.name]
                for a in modal_shim.DECLARED_APPS
                if target.name in a.registered_classes
            ),
            None,
        )
    )
    pset = parameter_set(klass) if klass is not None else None
    defaults = pset.defaults if pset else {}
    ours = dict(target.parameters)
    theirs = {**defaults, **spec.parameters}
    wrong: list[str] = []
    for k in sorted(set(ours) | set(theirs)):
        mine, pools = ours.get(k, _UNSET), theirs.get(k, _UNSET)
        if pools is not _UNSET and pset is not None:
            with contextlib.suppress(UsageError):
                pools = coerce_parameter(pools, pset.annotations.get(k), target.name, k)
        if mine != pools or type(mine) is not type(pools):
            default = " (its default)" if k in defaults and mine == defaults[k] else ""
            wrong.append(f"{k}: this call {_show(mine)}{default}, the pool {_show(pools)}")
    return wrong


_UNSET: Any = type("_Unset", (), {"__repr__": lambda self: "unset"})()


def _show(v: Any) -> str:
    return "unset" if v is _UNSET else repr(v)
