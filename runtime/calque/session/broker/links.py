"""The institution as the broker needs it: a link to every host's daemon, each lab's groups and share.

Hosts on this machine (``local_hosts``) are reached through their unix socket (``local.py``).
"""

from __future__ import annotations

from calque.session.broker.hosts import HostLink
from calque.session.broker.local import LocalHost
from calque.session.broker.process import Institution
from calque.session.brokerconfig import BrokerConfig


def load_institution(config: BrokerConfig) -> Institution:
    links: dict[str, HostLink] = {
        name: LocalHost(name, path, timeout=config.host_timeout) for name, path in config.local_hosts.items()
    }
    labs = {name: frozenset(lab.groups) for name, lab in config.labs.items()}
    shares = {name: lab.share for name, lab in config.labs.items()}
    return Institution(links=links, labs=labs, shares=shares)
