"""Every ``calque_*`` inventory variable checked before any host changes (``calque.gpu.preflight``).

The controller's action plugin gathers each host's ``calque_*`` variables, checks their types against
the roles' argument specs (Ansible's own validator), and hands them here with the names every role
and playbook documents. This operation adds what only the runtime knows:

- a name nothing documents is refused, with the closest documented name (``difflib``): a misspelled
  variable is otherwise silently ignored and its role's default used;
- ``/etc/calque/host.yaml``'s gpu section is assembled as the runtime role renders it and validated
  by the model calque loads it with (a simulated instance type the GPU catalog lacks is
  ``calque_runtime_gpu_sim.instance_type``), on a host where calque is not installed yet too;
- the session daemon's settings are assembled as the session_service role renders
  ``/etc/calque/session.yaml`` and validated by the model the daemon loads (``SessionConfig``), each
  error named by the inventory variable it came from (``default_ttl: 2hours`` is
  ``calque_session_service_default_ttl``), and MIG configs by the layout model ``calque gpu mig`` reads;
- each problem names the file that set the variable, where the inventory's group_vars and host_vars
  tell (``origin.py``).

It changes nothing: check mode and the real run are the same. Problems are a failure (exit 2).
"""

from __future__ import annotations

import difflib
from typing import Any

from pydantic import Field, ValidationError

from calque.errors import UsageError
from calque.models.base import CalqueModel
from calque.ops.base import Operation
from calque.ops.origin import find_origin
from calque.ops.outcome import Failure, Outcome

# session.yaml's keys the role renders from a variable of its own (the rest come from ..._settings)
SESSION_KEYS = {
    "default_ttl": "calque_session_service_default_ttl",
    "max_total_ttl": "calque_session_service_max_total_ttl",
    "mps": "calque_session_service_mps",
    "mps_user_model": "calque_session_service_mps_user_model",
    "spot": "calque_session_service_spot",
    "idle": "calque_session_service_idle",
}
POLICY_KEYS = {
    "admin_group": "calque_session_service_admin_group",
    "default": "calque_session_service_default_limits",
    "groups": "calque_session_service_group_limits",
    "users": "calque_session_service_user_limits",
}
SETTINGS = "calque_session_service_settings"
MIG_CONFIGS = "calque_gpu_layout_mig_configs"
LAYOUT_WINDOW = "calque_gpu_layout_window"
GPU_BACKEND = "calque_runtime_gpu_backend"  # host.yaml's gpu.backend (the runtime role)
GPU_SIM = "calque_runtime_gpu_sim"  # host.yaml's gpu.sim
INSTITUTION = "calque_session_service_institution"
MUNGE_KEY = "calque_munge_key_file"


class HostVariables(CalqueModel):
    """One host's ``calque_*`` variables and where its inventory lives (to name the file of a problem)."""

    variables: dict[str, Any] = Field(default_factory=dict)
    unresolved: list[str] = Field(default_factory=list, description="set, but not templatable yet: names only")
    errors: dict[str, str] = Field(default_factory=dict, description="variable -> the controller's finding")
    groups: list[str] = Field(default_factory=list, description="the host's groups (group_names)")
    inventory_dir: str | None = None
    playbook_dir: str | None = None


class PreflightRequest(CalqueModel):
    hosts: dict[str, HostVariables]
    known: list[str] = Field(description="every variable a role's argument spec or a playbook documents")


class Problem(CalqueModel):
    variable: str
    message: str
    hosts: list[str]
    origin: str | None = Field(None, description="the inventory file that set it, where it can be told")

    def describe(self) -> str:
        where = f" (set in {self.origin})" if self.origin else ""
        return f"{self.variable}{where}: {self.message} [{', '.join(self.hosts)}]"


class PreflightResult(CalqueModel):
    hosts: int
    variables: int = Field(description="variables checked, over all hosts")
    problems: list[Problem] = Field(default_factory=list)


def suggest(name: str, known: list[str]) -> str:
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.75)
    return f"; did you mean {close[0]}?" if close else "; no role or playbook of calque.gpu documents it"


def _session_doc(v: dict[str, Any]) -> tuple[dict[str, Any], dict[tuple[str, ...], str]] | None:
    """session.yaml as the session_service role renders it from what the inventory set (its defaults
    left to the model), and which variable each key came from; None when no session variable is set."""
    if not any(k.startswith("calque_session_service_") for k in v):
        return None
    doc: dict[str, Any] = {"version": 1}
    source: dict[tuple[str, ...], str] = {}
    for key, var in SESSION_KEYS.items():
        if var in v:
            # an empty idle is rendered as none (idle reclaim off), as the role's vars do
            doc[key], source[(key,)] = (None if key == "idle" and v[var] == {} else v[var]), var
    policy: dict[str, Any] = {}
    for key, var in POLICY_KEYS.items():
        if var in v:
            policy[key] = v[var] if not (key == "admin_group" and v[var] == "") else None
            source[("policy", key)] = var
    if policy:
        doc["policy"] = policy
    settings = v.get(SETTINGS)
    if isinstance(settings, dict):  # the role's combine(): each key replaces the rendered one whole
        for key, value in settings.items():
            doc[str(key)] = value
            source[(str(key),)] = f"{SETTINGS}.{key}"
    return doc, source


def _variable_of(loc: tuple[str, ...], source: dict[tuple[str, ...], str]) -> tuple[str, tuple[str, ...]]:
    """The variable a model error's location came from, and the location inside that variable."""
    for n in (2, 1):
        if loc[:n] in source:
            return source[loc[:n]], loc[n:]
    return (f"{SETTINGS}.{loc[0]}", loc[1:]) if loc else (SETTINGS, ())


def _message(err: Any, inner: tuple[str, ...], fields: list[str]) -> str:
    msg = str(err["msg"]).removeprefix("Value error, ").removeprefix("Assertion failed, ")
    where = ".".join(inner)
    if err["type"] == "extra_forbidden":
        key = err["loc"][-1]
        close = difflib.get_close_matches(str(key), fields, n=1, cutoff=0.75) if len(err["loc"]) == 1 else []
        hint = f"; did you mean {close[0]}?" if close else ""
        return f"{where or key} is not a setting the session daemon reads{hint}"
    shown = f"{where}={err['input']!r}: " if where else ("" if repr(err["input"]) in msg else f"{err['input']!r}: ")
    return f"{shown}{msg} (as the session daemon reads it)"


def _host_problems(v: dict[str, Any]) -> dict[str, str]:
    """host.yaml's gpu: section as the runtime role renders it (sim only with backend sim, unset keys
    left out), validated by the model the GPU modules and the session daemon load."""
    from calque.gpu.hostconfig import GpuHostConfig

    if GPU_BACKEND not in v and GPU_SIM not in v:
        return {}
    backend = v.get(GPU_BACKEND, "nvml")
    doc: dict[str, Any] = {"version": 1, "backend": backend}
    sim = v.get(GPU_SIM)
    if backend == "sim" and isinstance(sim, dict):
        doc["sim"] = {k: x for k, x in sim.items() if x is not None}
    out: dict[str, str] = {}
    try:
        GpuHostConfig.model_validate(doc)
    except ValidationError as exc:
        for err in exc.errors():
            loc = tuple(str(p) for p in err["loc"])
            var = f"{GPU_SIM}.{loc[1]}" if loc[:1] == ("sim",) and len(loc) > 1 else GPU_SIM
            var = GPU_BACKEND if loc[:1] == ("backend",) else var
            msg = str(err["msg"]).removeprefix("Value error, ")
            out.setdefault(var, f"{msg} (as calque reads /etc/calque/host.yaml)")
    return out


def model_problems(v: dict[str, Any]) -> dict[str, str]:
    """Variable -> message for what the runtime's models refuse."""
    from calque.gpu.layout import parse_entries
    from calque.session.session_config import SessionConfig

    out: dict[str, str] = {}
    built = _session_doc(v)
    if built is not None:
        doc, source = built
        try:
            SessionConfig.model_validate(doc)
        except ValidationError as exc:
            fields = sorted(SessionConfig.model_fields)
            for err in exc.errors():
                var, inner = _variable_of(tuple(str(p) for p in err["loc"]), source)
                out.setdefault(var, _message(err, inner, fields))
    for var, message in _host_problems(v).items():
        out.setdefault(var, message)
    out.update(institution_problems(v))
    configs = v.get(MIG_CONFIGS)
    if isinstance(configs, dict):
        for name, entries in configs.items():
            try:
                parse_entries(entries)
            except UsageError as exc:
                out.setdefault(f"{MIG_CONFIGS}.{name}", str(exc))
    windows = v.get(LAYOUT_WINDOW)
    if isinstance(windows, list):
        from calque.ops.mig_drain import parse_window

        for i, w in enumerate(windows):
            try:
                parse_window(str(w))
            except UsageError as exc:
                out.setdefault(f"{LAYOUT_WINDOW}[{i}]", str(exc))
    return out


def institution_problems(v: dict[str, Any]) -> dict[str, str]:
    """The institution as the role writes /etc/calque/institution.yaml, read by the model the daemons
    load; and the munge key it needs."""
    from calque.models.institution import Institution

    inst = v.get(INSTITUTION)
    if not isinstance(inst, dict) or not inst:
        return {}
    out: dict[str, str] = {}
    try:
        Institution.model_validate({"version": 1, **inst})
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        msg = str(err["msg"]).removeprefix("Value error, ")
        out[f"{INSTITUTION}.{where}" if where else INSTITUTION] = f"{msg} (as the session daemons read it)"
    if not v.get(MUNGE_KEY):
        out[MUNGE_KEY] = (
            f"must name the institution's munge key on the controller when {INSTITUTION} is set "
            "(an Ansible Vault file; or set calque_munge_key_generate: true to make one)"
        )
    return out


class PreflightOp(Operation[PreflightRequest, PreflightResult, PreflightResult]):
    name = "preflight"
    Request = PreflightRequest

    def plan(self, request: PreflightRequest) -> PreflightResult:
        known = sorted(set(request.known))
        found: dict[tuple[str, str, str], Problem] = {}
        checked = 0
        for host, hv in sorted(request.hosts.items()):
            checked += len(hv.variables) + len(hv.unresolved)
            mine = dict(hv.errors)
            for name in [*hv.variables, *hv.unresolved]:
                if name not in request.known:
                    mine.setdefault(name, "unknown variable" + suggest(name, known))
            for var, message in model_problems({k: x for k, x in hv.variables.items() if k not in mine}).items():
                mine.setdefault(var, message)
            for var, message in mine.items():
                origin = find_origin(var.split(".")[0], host, hv.groups, hv.inventory_dir, hv.playbook_dir)
                key = (var, message, origin or "")
                problem = found.setdefault(key, Problem(variable=var, message=message, hosts=[], origin=origin))
                problem.hosts.append(host)
        problems = sorted(found.values(), key=lambda p: (p.variable, p.hosts))
        return PreflightResult(hosts=len(request.hosts), variables=checked, problems=problems)

    def check(self, plan: PreflightResult) -> Outcome[PreflightResult]:
        return self._outcome(plan, check_mode=True)

    def apply(self, plan: PreflightResult) -> Outcome[PreflightResult]:
        return self._outcome(plan, check_mode=False)

    def _outcome(self, plan: PreflightResult, check_mode: bool) -> Outcome[PreflightResult]:
        failure = None
        if plan.problems:
            lines = "\n".join(f"- {p.describe()}" for p in plan.problems)
            failure = Failure(
                message=f"{len(plan.problems)} problem(s) in the inventory's calque variables; nothing was changed "
                f"on any host. Fix them in the inventory:\n{lines}",
                exit_code=UsageError.exit_code,
            )
        return Outcome[PreflightResult](
            resource=self.name,
            check_mode=check_mode,
            changed=False,
            actions=[f"checked {plan.variables} calque variable(s) of {plan.hosts} host(s)"],
            failure=failure,
            result=plan,
        )
