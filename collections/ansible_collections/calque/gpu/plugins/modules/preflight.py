#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: (c) 2026, calque developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: preflight
short_description: Check every calque variable of every host before any host changes
version_added: 0.2.0
description:
  - Runs on the controller (an action plugin; it connects to no host). For every host of O(hosts) it reads the
    host's C(calque_*) variables and checks each one before any play changes anything.
  - A name no role's C(meta/argument_specs.yml) documents is refused, with the closest documented name
    ("did you mean ..."); a misspelled variable is otherwise silently ignored and its role's default used.
  - A documented variable is checked against its argument spec by Ansible's own validator (type, choices,
    elements, nested options), as the role would check it when it starts, but before the first play.
  - The session daemon's settings are assembled as the C(calque.gpu.session_service) role renders
    C(/etc/calque/session.yaml) and validated by the model the daemon loads, each error named by the
    inventory variable it came from (a duration such as C(2hours) in C(calque_session_service_default_ttl));
    MIG configs are validated by the layout model C(calque gpu mig) reads.
  - Each problem names the file that set the variable where the inventory's C(group_vars) and
    C(host_vars) tell, and the hosts it applies to. Problems fail the task on every host of the play.
  - A thin face over the C(calque.ops.preflight) operation; it needs the calque runtime on the controller.
author: calque developers (@calque)
options:
  hosts:
    description:
      - The hosts whose variables are checked; default every host of the play (C(ansible_play_hosts_all)).
    type: list
    elements: str
  ignore:
    description:
      - Site-local variable names that start with C(calque_) but belong to no calque role (not refused).
    type: list
    elements: str
    default: []
extends_documentation_fragment:
  - calque.gpu.runtime
  - calque.gpu.attributes
  - calque.gpu.attributes.changes_nothing
attributes:
  check_mode:
    support: full
    details: Reads variables only; the same in check mode.
"""

EXAMPLES = r"""
- name: Check every calque variable before any host changes
  calque.gpu.preflight:
  run_once: true

- name: A site variable of our own that happens to start with calque_
  calque.gpu.preflight:
    ignore: [calque_site_contact]
  run_once: true
"""

RETURN = r"""
hosts:
  description: How many hosts were checked.
  returned: always
  type: int
variables:
  description: How many variables were checked, over all hosts.
  returned: always
  type: int
problems:
  description: One entry per problem, with the hosts it applies to and the file that set the variable.
  returned: always
  type: list
  elements: dict
  sample:
    - variable: calque_session_service_max_totl_ttl
      message: unknown variable; did you mean calque_session_service_max_total_ttl?
      hosts: [teach0, teach1]
      origin: inventories/institution/group_vars/teaching.yml
"""

from ansible.module_utils.basic import AnsibleModule


def main():
    module = AnsibleModule(
        argument_spec=dict(
            hosts=dict(type="list", elements="str"),
            ignore=dict(type="list", elements="str", default=[]),
        ),
        supports_check_mode=True,
    )
    module.fail_json(msg="calque.gpu.preflight runs on the controller as an action plugin; it has no module side")


if __name__ == "__main__":
    main()
