"""The master's address on the site's network interface: the interface a
site names (NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME), its IPv4 address and
network read from the kernel (SIOCGIFADDR and SIOCGIFNETMASK ioctls), and
MASTER_ADDR as the master host itself should use it (hpcyolo.node.distenv)."""

from __future__ import annotations

import errno
import ipaddress
import struct
from typing import Mapping

from hpcyolo_trainer.common.errors import HpcyoloError, shown

_SIOCGIFADDR, _SIOCGIFNETMASK = 0x8915, 0x891B  # <linux/sockios.h>

def site_interface(env: Mapping[str, str]) -> str | None:
    """The interface the site names: NCCL_SOCKET_IFNAME, else
    GLOO_SOCKET_IFNAME; the first of a list ('hsn0,hsn1'); none for an
    exclusion list ('^docker,lo'); '=' (NCCL's exact match) dropped."""
    for name in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"):
        value = env.get(name, "").strip()
        if value and not value.startswith("^"):
            return value.split(",")[0].strip().lstrip("=") or None
    return None


def resolve_master(addr: str, interface: str | None, *, hostname: str | None = None) -> str:
    """MASTER_ADDR as this host should use it. On the master host itself,
    with an interface named, the interface's IPv4 address (so rank 0 connects
    to the store on the fast network, not on whatever its own name resolves
    to: 127.0.1.1 on Debian, or the management network), unless the name
    already resolves into that interface's network. Elsewhere, the name."""
    import socket  # here: `hpcyolo render`, which imports this module through the plan, does without it (3 ms)

    if not interface:
        return addr
    host = hostname or socket.gethostname()
    if addr not in (host, host.split(".")[0]):
        return addr
    interface = interface.split(",")[0].strip().lstrip("=")
    ip, network = interface_ipv4(_match_interface(interface, host))
    if any(a in network for a in _ipv4_addresses(addr)):
        return addr  # e.g. the testbed: node1 is 127.0.0.11, on lo
    return ip


def _match_interface(name: str, host: str) -> str:
    """The exact name, else the first interface it prefixes (NCCL's rule:
    NCCL_SOCKET_IFNAME=ib matches ib0)."""
    import socket

    names = [n for _, n in socket.if_nameindex()]
    if name in names:
        return name
    match = next((n for n in names if n.startswith(name)), None)
    if match is None:
        raise HpcyoloError(f"network interface {shown(name)} (NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME) does not exist on "
                           f"{host}; it has: {', '.join(names)}")
    return match


def interface_ipv4(name: str) -> tuple[str, ipaddress.IPv4Network]:
    """The IPv4 address and network of an interface (Linux: netdevice(7) ioctls)."""
    import fcntl
    import socket

    request = struct.pack("256s", name.encode()[:15])
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            addr = socket.inet_ntoa(fcntl.ioctl(s.fileno(), _SIOCGIFADDR, request)[20:24])
            mask = socket.inet_ntoa(fcntl.ioctl(s.fileno(), _SIOCGIFNETMASK, request)[20:24])
        except OSError as e:
            why = {errno.ENODEV: "does not exist", errno.EADDRNOTAVAIL: "has no IPv4 address"}.get(e.errno, e.strerror)
            raise HpcyoloError(f"network interface {shown(name)} {why} on {socket.gethostname()}") from None
    return addr, ipaddress.IPv4Network(f"{addr}/{mask}", strict=False)


def _ipv4_addresses(name: str) -> list[ipaddress.IPv4Address]:
    import socket

    try:
        infos = socket.getaddrinfo(name, None, family=socket.AF_INET, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        return []
    return [ipaddress.IPv4Address(info[4][0]) for info in infos]
