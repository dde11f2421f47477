#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: (c) 2026, calque developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: pool_queue
short_description: One SQS queue per model, with its dead-letter queue, for a calque warm pool
version_added: 0.1.0
description:
  - Creates, updates or deletes the standard SQS queue of one model's warm pool and its dead-letter
    queue C(<name>-dlq), joined by a redrive policy.
  - The queue name derives from O(model) as C(calque-pool-<slug>-<hash>), where the hash is 8 hex
    digits of the SHA-256 of the model; names are at most 80 characters and two distinct models never
    share a queue.
  - A thin face over C(calque.aws.queue.PoolQueue); the bounds of every attribute are those of the
    runtime's C(QueueSettings).
  - Options left out keep the current value of an existing queue; a new queue gets the defaults
    given below.
author: calque developers (@calque)
options:
  model:
    description:
      - The pool's model name, its identity (for example V(meta-llama/Llama-3.1-8B-Instruct)).
      - Must not be empty.
    type: str
    required: true
  state:
    description:
      - V(present) creates the queue and its dead-letter queue or brings their attributes to the
        options given; V(absent) deletes both.
    type: str
    choices: [present, absent]
    default: present
  visibility_timeout:
    description:
      - Seconds a received claim stays invisible to other workers, C(0..43200) (12 hours).
      - Workers extend it while they work (heartbeat). Defaults to C(300) for a new queue.
    type: int
  message_retention:
    description:
      - Seconds SQS keeps an unclaimed message, C(60..1209600) (14 days). Defaults to C(345600) (4 days).
    type: int
  receive_wait:
    description:
      - Long-poll wait of a receive in seconds, C(0..20). Defaults to C(20).
    type: int
  max_receive_count:
    description:
      - Receives after which SQS moves a message to the dead-letter queue, C(1..1000). Defaults to C(5).
    type: int
  dlq_retention:
    description:
      - Seconds the dead-letter queue keeps a message, C(60..1209600). Defaults to C(1209600) (14 days).
    type: int
  encryption:
    description:
      - SQS-managed server-side encryption of both queues. Defaults to V(true).
    type: bool
notes:
  - With the environment variable E(CALQUE_OFFLINE=1) the module refuses any endpoint that is not
    loopback, so offline runs (the sandbox, the tests) can never reach a real AWS account.
extends_documentation_fragment:
  - calque.gpu.runtime
  - calque.gpu.attributes
  - amazon.aws.common.modules
  - amazon.aws.region.modules
  - amazon.aws.boto3
attributes:
  check_mode:
    support: full
    details: Plans the change (the same plan the real run applies) and reports it without calling any write API.
  diff_mode:
    support: full
    details: Shows the queue's attributes before and after.
  idempotent:
    support: full
    details: Compares the queue's current attributes with the requested ones; a queue that matches is not touched.
"""

EXAMPLES = r"""
- name: Create the pool queue of one model
  calque.gpu.pool_queue:
    model: meta-llama/Llama-3.1-8B-Instruct
    visibility_timeout: 600
    max_receive_count: 3
    region: us-east-1

- name: Point every calque and amazon.aws module at a local moto server
  module_defaults:
    group/aws:
      endpoint_url: http://127.0.0.1:5000
      region: us-east-1
  block:
    - name: Create the queue offline
      calque.gpu.pool_queue:
        model: sandbox/echo

- name: Delete the queue and its dead-letter queue
  calque.gpu.pool_queue:
    model: meta-llama/Llama-3.1-8B-Instruct
    state: absent
"""

RETURN = r"""
queue_name:
  description: Name of the pool queue (derived from the model).
  returned: always
  type: str
  sample: calque-pool-meta-llama-llama-3-1-8b-instruct-1a2b3c4d
queue_url:
  description: URL of the pool queue; null when it does not exist (or would be created in check mode).
  returned: always
  type: str
  sample: https://sqs.us-east-1.amazonaws.com/123456789012/calque-pool-sandbox-echo-6b1b2c3d
queue_arn:
  description: ARN of the pool queue; null when it does not exist.
  returned: always
  type: str
  sample: arn:aws:sqs:us-east-1:123456789012:calque-pool-sandbox-echo-6b1b2c3d
dlq_url:
  description: URL of the dead-letter queue; null when it does not exist.
  returned: always
  type: str
  sample: https://sqs.us-east-1.amazonaws.com/123456789012/calque-pool-sandbox-echo-6b1b2c3d-dlq
dlq_arn:
  description: ARN of the dead-letter queue; null when it does not exist.
  returned: always
  type: str
  sample: arn:aws:sqs:us-east-1:123456789012:calque-pool-sandbox-echo-6b1b2c3d-dlq
attributes:
  description: The queue's settings after the run (empty when the queue is absent).
  returned: always
  type: dict
  sample:
    visibility_timeout: 300
    message_retention: 345600
    receive_wait: 20
    max_receive_count: 5
    dlq_retention: 1209600
    encryption: true
"""

from ansible_collections.amazon.aws.plugins.module_utils.modules import AnsibleAWSModule
from ansible_collections.calque.gpu.plugins.module_utils._runtime import (
    HAS_CALQUE,
    fail_on_calque_error,
    require_calque,
)

if HAS_CALQUE:
    from pydantic import ValidationError

    from calque.aws.clients import check_offline_endpoint, resolve_endpoint, retry_config
    from calque.aws.queue import PoolQueue
    from calque.errors import CalqueError
    from calque.models import QueueSettings

SETTINGS = ("visibility_timeout", "message_retention", "receive_wait", "max_receive_count", "dlq_retention", "encryption")


def settings_error(exc):
    """One sentence per bad option, naming the option, the value given and the allowed range."""
    parts = []
    for err in exc.errors():
        name = ".".join(str(p) for p in err.get("loc", ())) or "options"
        field = QueueSettings.model_fields.get(name)
        hint = " (allowed: %s)" % field.description if field is not None and field.description else ""
        parts.append("%s=%r: %s%s; change %s" % (name, err.get("input"), err.get("msg"), hint, name))
    return "invalid pool queue settings: " + "; ".join(parts)


def sqs_client(module):
    """The SQS client of amazon.aws's connection options, with botocore standard retries, refused offline
    unless its endpoint is loopback."""
    sqs = module.client("sqs", config=retry_config())
    explicit = resolve_endpoint("sqs", module.params.get("endpoint_url"))
    check_offline_endpoint("sqs", sqs.meta.endpoint_url if explicit else None)
    return sqs


def run(module):
    params = module.params
    if not (params["model"] or "").strip():
        module.fail_json(msg="model is empty: give the pool's model name, e.g. model: meta-llama/Llama-3.1-8B-Instruct")
    given = dict((k, params[k]) for k in SETTINGS if params[k] is not None)
    try:
        QueueSettings(**given)  # validate before touching AWS
    except ValidationError as exc:
        module.fail_json(msg=settings_error(exc))

    queue = PoolQueue(sqs_client(module), params["model"])
    if params["state"] == "absent":
        change = queue.remove(check_mode=module.check_mode)
    else:
        current = queue.state()
        keep = dict((k, v) for k, v in current.attributes.items() if v is not None) if current.exists else {}
        keep.update(given)
        try:
            settings = QueueSettings(**keep)
        except ValidationError as exc:
            module.fail_json(msg=settings_error(exc))
        change = queue.ensure(settings, check_mode=module.check_mode)

    after = change.after
    result = dict(
        changed=change.changed,
        queue_name=after.queue_name,
        queue_url=after.queue_url,
        queue_arn=after.queue_arn,
        dlq_url=after.dlq_url,
        dlq_arn=after.dlq_arn,
        attributes=after.attributes,
    )
    if module._diff:
        result["diff"] = dict(
            before=dict(exists=change.before.exists, attributes=change.before.attributes),
            after=dict(exists=after.exists, attributes=after.attributes),
        )
    return result


def main():
    argument_spec = dict(
        model=dict(type="str", required=True),
        state=dict(type="str", choices=["present", "absent"], default="present"),
        visibility_timeout=dict(type="int"),
        message_retention=dict(type="int"),
        receive_wait=dict(type="int"),
        max_receive_count=dict(type="int"),
        dlq_retention=dict(type="int"),
        encryption=dict(type="bool"),
    )
    module = AnsibleAWSModule(argument_spec=argument_spec, supports_check_mode=True)
    require_calque(module)
    try:
        module.exit_json(**run(module))
    except CalqueError as exc:
        fail_on_calque_error(module, exc, queue_name=None)


if __name__ == "__main__":
    main()
