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
  - A thin face over the C(calque.ops.pool_queue) operation (C(calque.aws.queue.PoolQueue)); the bounds
    of every attribute are those of the runtime's C(QueueSettings).
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
extends_documentation_fragment:
  - calque.gpu.runtime
  - calque.gpu.offline
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
from ansible_collections.calque.gpu.plugins.module_utils._ops import run_op


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
    run_op(AnsibleAWSModule, "pool_queue", argument_spec)


if __name__ == "__main__":
    main()
