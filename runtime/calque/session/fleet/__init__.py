"""An elastic session host's own side of its class (issue 25): what it does with AWS about itself only.

- ``protect.py``: scale-in protection while a session is live, and the way out (drain, then the
  lifecycle action) when the group ends the instance anyway;
- ``register.py``: its registration with the broker (an SSM parameter under its class's path);
- ``mungekey.py``: the institution's munge key from the one place its instance profile may read;
- ``userdata.py``: the user-data that makes an instance a session host without Ansible.

It reads the host's own daemon through ``session/client`` (root's ``list``) and never imports
``session/daemon/``: the daemon never calls AWS, and a session's checkout never waits on this.
"""
