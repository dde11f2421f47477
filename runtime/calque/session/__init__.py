"""Session service (Layer 2): users check MIG slices and MPS slots out and in, as themselves.

Two rooms that never import each other:

* ``client/``: what a researcher's ``calque session ...`` imports: the socket client
  (``connection.py``, which checks who answers), the verbs (``verbs.py``), ``--shell`` output
  (``shellenv.py``) and the default paths (``paths.py``).
* ``daemon/``: the privileged service (``calque session serve``): socket, service, registry,
  timers, node guard, cgroups, audit, metrics.

Both speak the contracts of ``calque.models.session`` (each operation's arguments and answer).
``session_config.py`` (the daemon's config, also read by ``calque config check``) and ``assets.py`` (the
packaged systemd unit) belong to neither.
"""
