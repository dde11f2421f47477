"""The institution as the broker needs it: a link to every host's daemon, each lab's groups and share.

Hosts on this machine (``local_hosts`` in ``broker.yaml``) are reached through their unix socket
(``local.py``); every other host of ``institution.yaml`` over TCP with munge (``RemoteHost``), as
the broker's service user acting for the user it names.
"""

from __future__ import annotations

from calque.models.fleet import HostRegistration
from calque.session.broker.broker_config import BrokerConfig
from calque.session.broker.broker_process import Institution
from calque.session.broker.hosts import HostLink
from calque.session.broker.local import LocalHost
from calque.session.institution import load_institution as load_file
from calque.session.remote import RemoteHost


def load_institution(config: BrokerConfig) -> Institution:
    inst = load_file(config.institution)
    links: dict[str, HostLink] = {
        name: LocalHost(name, path, timeout=config.host_timeout) for name, path in config.local_hosts.items()
    }

    def remote(name: str, address: str, port: int, service_user: str = "root") -> RemoteHost:
        """Another host, reached as the broker reaches each one: munge, the host timeout, no retries."""
        return RemoteHost(
            name,
            address,
            port,
            munge_socket=config.munge_socket,
            timeout=config.host_timeout,
            retry_for=0.0,
            service_user=service_user,
        )

    for h in inst.hosts:
        if h.name not in links:
            links[h.name] = remote(h.name, h.address, h.port, h.service_user)
    labs = {lab.name: frozenset(lab.groups) for lab in inst.labs}
    shares = {lab.name: lab.share for lab in inst.labs}

    def link(reg: HostRegistration) -> HostLink:  # an elastic host, as the broker reaches every other host
        return remote(reg.name, reg.address, reg.port)

    name = inst.broker.name if inst.broker is not None else "broker"
    hub = inst.hub.service_user if inst.hub is not None else None
    return Institution(
        links=links, labs=labs, shares=shares, link=link, budget_labs=tuple(inst.labs), name=name, hub_user=hub
    )
