"""The session daemon: the privileged service behind the socket (root, under systemd).

Read in this order: ``daemon_process.py`` (which process builds what), ``host.py`` (what they share),
``listener.py`` and ``acceptor.py`` (the socket), ``service.py`` and ``checkout.py`` (what each request
does), ``registry.py`` (SQLite), ``enforcer.py`` and ``cleanup.py`` (timers, ends), ``guard.py`` and
``nodes.py`` (the capability nodes), ``adopt.py`` and ``cgroup.py`` (a session is a cgroup).
Nothing here is imported by the researcher's command (``calque.session.client``); the two share the
contracts in ``calque.models.session``. ``calque session serve`` runs it as ``python -m calque.session.daemon``.
"""
