# -*- coding: utf-8 -*-
# Copyright: (c) 2026, calque developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type


class ModuleDocFragment(object):
    # What an instance is launched from, shared by calque.gpu.pool_group and calque.gpu.ec2_cohort
    # (both through calque.aws.acquire.launch_spec).
    DOCUMENTATION = r"""
options:
  ami:
    description:
      - AMI id. Mutually exclusive with O(ami_ssm_parameter).
    type: str
  ami_ssm_parameter:
    description:
      - SSM parameter whose value is the AMI id, for example the AWS Deep Learning Base AMI's
        C(/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-22.04/latest/ami-id),
        which is used when neither this nor O(ami) is given.
    type: str
  root_volume:
    description:
      - The root EBS volume. It is always encrypted and deleted with the instance.
    type: dict
    default: {}
    suboptions:
      size_gib:
        description: Size in GiB, C(8..16384).
        type: int
        default: 100
      type:
        description: EBS volume type.
        type: str
        choices: [gp3, gp2, io1, io2]
        default: gp3
      kms_key_id:
        description: KMS key for the encryption. Unset uses the account's default EBS key.
        type: str
  instance_profile:
    description:
      - IAM instance profile of the instances, by name or ARN.
    type: str
  security_groups:
    description:
      - Security group ids.
    type: list
    elements: str
    default: []
  key_name:
    description:
      - EC2 key pair name.
    type: str
"""
