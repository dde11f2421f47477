"""The institution as the broker needs it: a link to every host's daemon, each lab's groups and share.

Hosts on this machine (``local_hosts``) are reached through their unix socket (``local.py``); the
others (``hosts``) over TCP with munge (``calque.session.remote``).
"""

from __future__ import annotations

from calque.session.broker.hosts import HostLink
from calque.session.broker.local import LocalHost
from calque.session.broker.process import Institution
from calque.session.brokerconfig import BrokerConfig
from calque.session.remote import RemoteHost


def load_institution(config: BrokerConfig) -> Institution:
    links: dict[str, HostLink] = {
        name: LocalHost(name, path, timeout=config.host_timeout) for name, path in config.local_hosts.items()
    }
    for name, at in config.hosts.items():
        if name not in links:  # a host on this machine is reached by its socket, whatever else is said
            links[name] = RemoteHost(name, at.address, at.port, config.munge_socket, timeout=config.host_timeout)
    labs = {name: frozenset(lab.groups) for name, lab in config.labs.items()}
    shares = {name: lab.share for name, lab in config.labs.items()}
    return Institution(links=links, labs=labs, shares=shares)
