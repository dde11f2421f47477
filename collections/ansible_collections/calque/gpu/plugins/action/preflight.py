# -*- coding: utf-8 -*-
# Copyright: (c) 2026, calque developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

"""calque.gpu.preflight on the controller: every host's calque_* variables, checked before any change.

It reads each host's variables from hostvars (no connection to any host), checks each documented
one against its role's argument spec with Ansible's own validator, and hands them to the runtime's
``calque.ops.preflight`` operation for the names nothing documents and the runtime's models.
"""

from __future__ import absolute_import, annotations, division, print_function

import os

import yaml
from ansible.errors import AnsibleError
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.plugins.action import ActionBase

try:
    from calque.errors import CalqueError
    from calque.ops import operation

    HAS_CALQUE = True
except ImportError:
    HAS_CALQUE = False

__metaclass__ = type

ROLES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "roles")
PREFIX = "calque_"
# The same as plugins/modules/preflight.py's (its documentation); tests/ansible/test_module_contracts.py checks it.
ARGUMENT_SPEC = dict(
    hosts=dict(type="list", elements="str"),
    ignore=dict(type="list", elements="str", default=[]),
)


def role_specs(roles_dir=ROLES):
    """Every option of every entry point of every role's meta/argument_specs.yml, by name (first wins:
    roles that share a variable, such as calque_runtime_venv, document it alike)."""
    specs = {}
    for role in sorted(os.listdir(roles_dir)):
        path = os.path.join(roles_dir, role, "meta", "argument_specs.yml")
        if not os.path.isfile(path):
            continue
        with open(path, encoding="utf-8") as fh:
            doc = yaml.safe_load(fh) or {}
        for entry in (doc.get("argument_specs") or {}).values():
            for name, spec in (entry.get("options") or {}).items():
                specs.setdefault(name, spec)
    return specs


def spec_error(name, spec, value):
    """Ansible's own verdict on one variable against its argument spec, or None."""
    one = dict(spec)
    one.pop("required", None)
    found = ArgumentSpecValidator({name: one}).validate({name: value})
    return "; ".join(found.error_messages) or None


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False
    _supports_check_mode = True

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        task_vars = task_vars or {}
        _validation, args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        if not HAS_CALQUE:
            result.update(
                failed=True,
                msg="calque.gpu.preflight needs the calque runtime on the controller: run ansible-playbook from the "
                "virtualenv calque is installed in (pip install calque)",
            )
            return result
        specs = role_specs()
        hostvars = task_vars["hostvars"]
        hosts = args["hosts"] if args["hosts"] is not None else task_vars.get("ansible_play_hosts_all", [])
        request = {"hosts": {}, "known": sorted(set(specs) | set(args["ignore"]))}
        for host in hosts:
            request["hosts"][host] = self._host(hostvars[host], specs)
        try:
            op = operation("preflight")()
            outcome = op.run(op.request(request), check_mode=bool(self._task.check_mode))
        except CalqueError as exc:
            raise AnsibleError("calque.gpu.preflight: %s" % exc)
        result["changed"] = False
        result.update(outcome.result.model_dump(mode="json"))
        if outcome.failure is not None:
            result.update(failed=True, msg=outcome.failure.message, calque_exit_code=outcome.failure.exit_code)
        else:
            result["msg"] = outcome.actions[0]
        return result

    @staticmethod
    def _host(hv, specs):
        """One host's calque_* variables (those that template here), and Ansible's findings on them."""
        variables, errors, unresolved = {}, {}, []
        for name in sorted(k for k in hv.keys() if k.startswith(PREFIX)):
            try:
                value = hv[name]
            except Exception:  # refers to a variable defined later (a role's default): its name is still checked
                unresolved.append(name)
                continue
            variables[name] = value
            if name in specs:
                found = spec_error(name, specs[name], value)
                if found:
                    errors[name] = found
        raw = {}
        for key in ("group_names", "inventory_dir", "playbook_dir"):
            try:
                raw[key] = hv[key]
            except Exception:
                raw[key] = None
        return {
            "variables": variables,
            "unresolved": unresolved,
            "errors": errors,
            "groups": list(raw["group_names"] or []),
            "inventory_dir": raw["inventory_dir"],
            "playbook_dir": raw["playbook_dir"],
        }
