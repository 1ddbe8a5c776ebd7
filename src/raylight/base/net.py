"""Where a run's own listeners bind: one address, never every interface.

Rank 0's rendezvous store (``torch.distributed.TCPStore``) and gloo's sockets carry no
authentication, and gloo peers unpickle what ``all_gather_object`` sends them, so they
must not be reachable from anywhere else. When every worker of a group is on one node
they listen on loopback; across nodes, on the address Ray gave each node (the cluster's
own network), found by interface so gloo binds that address alone.
"""

from __future__ import annotations

import ipaddress
import socket


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an IP address or ``localhost``) names this machine's loopback."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def loopback_interface() -> str:
    names = {name for _, name in socket.if_nameindex()}
    return "lo" if "lo" in names else "lo0"


def interface_for(ip: str) -> str | None:
    """The name of the network interface that holds address ``ip`` (IPv4 or IPv6, an
    interface's first address or any other it holds), or None: an address no interface
    holds here."""
    try:
        wanted = ipaddress.ip_address(ip)
    except ValueError:
        return None
    if wanted.is_loopback:
        return loopback_interface()
    import psutil

    for name, addresses in psutil.net_if_addrs().items():
        for address in addresses:
            if address.family not in (socket.AF_INET, socket.AF_INET6):
                continue
            try:
                if ipaddress.ip_address(address.address.split("%")[0]) == wanted:  # fe80::1%eth0: the zone is the name
                    return name
            except ValueError:
                continue
    return None


def listen_socket(host: str, backlog: int = 2048) -> socket.socket:
    """A TCP socket listening on ``host`` alone, on a port the system chooses."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, 0))
        sock.listen(backlog)
    except BaseException:
        sock.close()
        raise
    return sock
