# -*- coding: utf-8 -*-
# Copyright: (c) 2026, calque developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

"""Private to the calque.gpu collection: run one calque operation (``calque.ops``) for a module.

A module is its documentation, its argument spec and one ``run_op`` call. ``run_op`` validates the
options with the operation's request model, plans (check mode) or plans and applies, and exits with
``changed``, ``diff`` (the Outcome's before/after) and the operation's result; a ``CalqueError`` or
an Outcome's failure becomes ``fail_json`` with the message and ``calque_exit_code``.
"""

from __future__ import annotations

from ansible_collections.calque.gpu.plugins.module_utils._runtime import HAS_CALQUE, require_calque

if HAS_CALQUE:
    from calque.errors import CalqueError


class ModuleAws(object):
    """AWS access for the runtime from amazon.aws's connection options (credentials, region, endpoint_url)."""

    def __init__(self, module):
        self.module = module
        self.region = module.region
        self.endpoint_url = module.params.get("endpoint_url")
        self.profile = module.params.get("profile")

    def client(self, service):
        """A client with botocore standard retries, refused offline unless its endpoint is loopback."""
        from calque.aws.clients import check_offline_endpoint, resolve_endpoint, retry_config

        conn = self.module.client(service, config=retry_config())
        explicit = resolve_endpoint(service, self.endpoint_url)
        check_offline_endpoint(service, conn.meta.endpoint_url if explicit else None)
        return conn


def run_op(module_class, name, argument_spec, **module_kwargs):
    """Build the module from ``argument_spec``, run operation ``name`` and exit (never returns)."""
    module = module_class(argument_spec=argument_spec, supports_check_mode=True, **module_kwargs)
    require_calque(module)
    from calque.ops import operation

    try:
        op = operation(name)(aws=ModuleAws(module) if hasattr(module, "client") else None)
        request = op.request(dict((key, module.params[key]) for key in argument_spec))
        outcome = op.run(request, check_mode=module.check_mode)
    except CalqueError as exc:
        module.fail_json(msg=str(exc), calque_exit_code=exc.exit_code)
    for warning in outcome.warnings:
        module.warn(warning)
    result = outcome.result.model_dump(mode="json")
    if module._diff:
        result["diff"] = dict(before=outcome.before, after=outcome.after)
    if outcome.failure is not None:
        failure = outcome.failure
        module.fail_json(msg=failure.message, calque_exit_code=failure.exit_code, changed=outcome.changed, **result)
    module.exit_json(changed=outcome.changed, **result)
