"""Where a run's own listeners bind: one address, never every interface.

Rank 0's rendezvous store (``torch.distributed.TCPStore``) and gloo's sockets carry no
authentication, and gloo peers unpickle what ``all_gather_object`` sends them, so they
must not be reachable from anywhere else. When every worker of a group is on one node
they listen on loopback; across nodes, on the address Ray gave each node (the cluster's
own network), found by interface so gloo binds that address alone.
"""

from __future__ import annotations

import fcntl
import ipaddress
import socket
import struct

_SIOCGIFADDR = 0x8915  # Linux: the IPv4 address of an interface


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
    """The name of the network interface that holds IPv4 address ``ip``, or None
    (another operating system, IPv6, or an address no interface holds)."""
    try:
        if ipaddress.ip_address(ip).is_loopback:
            return loopback_interface()
    except ValueError:
        return None
    try:
        names = [name for _, name in socket.if_nameindex()]
    except OSError:
        return None
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for name in names:
            try:
                raw = fcntl.ioctl(probe.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:  # no IPv4 address on this interface
                continue
            if socket.inet_ntoa(raw[20:24]) == ip:
                return name
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
