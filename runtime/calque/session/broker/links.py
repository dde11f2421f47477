"""The institution as the broker needs it: a link to every host's daemon, each lab's groups and share.

Hosts on this machine (``local_hosts``) are reached through their unix socket (``local.py``); the
other hosts of ``institution.yaml`` over TCP with a munge credential per request
(``calque.session.remote``). A host named in both is reached through its socket.
"""

from __future__ import annotations

from calque.session.broker.hosts import HostLink
from calque.session.broker.local import LocalHost
from calque.session.broker.process import Institution
from calque.session.brokerconfig import BrokerConfig
from calque.session.institution import load_institution as load_institution_file
from calque.session.remote import RemoteHost


def load_institution(config: BrokerConfig) -> Institution:
    links: dict[str, HostLink] = {
        name: LocalHost(name, path, timeout=config.host_timeout) for name, path in config.local_hosts.items()
    }
    for h in load_institution_file(config.institution).hosts:
        if h.name not in links:
            # one try per call: the broker's own loop retries, and a host that refuses is skipped (NotSent)
            links[h.name] = RemoteHost(h.name, h.address, h.port, config.munge_socket, config.host_timeout, retry_for=0)
    labs = {name: frozenset(lab.groups) for name, lab in config.labs.items()}
    shares = {name: lab.share for name, lab in config.labs.items()}
    return Institution(links=links, labs=labs, shares=shares)
