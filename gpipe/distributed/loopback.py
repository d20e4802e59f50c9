"""A gloo process group of ranks on this one machine that listens on the loopback interface and nowhere else.

Note [loopback only]: ``init_process_group("gloo", init_method="tcp://127.0.0.1:PORT")`` connects to 127.0.0.1,
but its store's server listens on every interface (``*:PORT``, IPv4 and IPv6) and answers anyone, unauthenticated;
and gloo binds each group's pairs to the address this machine's hostname resolves to (on most machines a LAN
address; the loopback address only where the hostname resolves there). Ranks that are all on this machine need
neither, so :func:`init_loopback_group` makes the store on a socket it binds to 127.0.0.1 itself
(``TCPStore(master_listen_fd=...)``) and points gloo at the loopback interface (``GLOO_SOCKET_IFNAME``, which
gloo reads whenever a group is made, so the groups made later in the process listen there too)::

    port = free_port()                                     # in the launcher
    init_loopback_group(rank, world, port, timeout)        # in each spawned rank, instead of init_process_group

The same holds for ranks launched by hand with ``MASTER_ADDR`` a loopback address: torch's ``env://`` store would
listen on every interface too (``TCPStore``'s ``host_name`` is where clients connect, not where its server binds),
so :class:`gpipe.distributed.DistributedGPipe` starts their group here (:func:`is_loopback`).
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import re
import socket

import torch.distributed as dist

__all__ = ["LOOPBACK", "free_port", "init_loopback_group", "is_loopback", "loopback_interface"]

LOOPBACK = "127.0.0.1"


def free_port() -> int:
    """A TCP port free on the loopback interface now (the launcher's pick; rank 0 binds it again)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


def loopback_interface() -> str:
    """The name of this machine's loopback interface (``lo`` on Linux, ``lo0`` on macOS).

    Raises:
        RuntimeError: no interface has a loopback's name.
    """
    names = [name for _, name in socket.if_nameindex()]
    found = [name for name in names if re.fullmatch(r"lo\d*", name)]
    if not found:
        raise RuntimeError(f"no loopback interface among this machine's interfaces ({', '.join(names) or 'none'}); "
                           "the ranks would have to listen on a network")
    return found[0]


def is_loopback(address: str) -> bool:
    """Whether ``address`` (an IP address or ``localhost``) is this machine's loopback, where no network reaches."""
    if address.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:  # a host name: it may resolve anywhere
        return False


def init_loopback_group(rank: int, world: int, port: int, timeout: datetime.timedelta, *, backend: str = "gloo",
                        address: str = LOOPBACK) -> None:
    """Start the default ``backend`` group of ``world`` ranks on this machine, listening on loopback only (Note
    [loopback only]): rank 0 serves the store on ``address:port`` (a loopback address: :func:`is_loopback`;
    ``localhost`` is served on 127.0.0.1); this process's gloo groups, this one and those made later, bind to the
    loopback interface.

    Raises:
        ValueError: ``address`` is not a loopback address.
        RuntimeError: no loopback interface (:func:`loopback_interface`); the store or a rank did not answer
            within ``timeout``.
        OSError: rank 0 cannot bind ``address:port``.
    """
    if not is_loopback(address):
        raise ValueError(f"{address!r} is not a loopback address; ranks on a network use torch's own rendezvous")
    address = LOOPBACK if address.lower() == "localhost" else address
    os.environ["GLOO_SOCKET_IFNAME"] = loopback_interface()  # read by gloo at each group's making
    if rank == 0:
        family = socket.AF_INET6 if ipaddress.ip_address(address).version == 6 else socket.AF_INET
        listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind((address, port))
            listener.listen(max(world, 128))
        except OSError:
            listener.close()
            raise
        store = dist.TCPStore(address, port, world, True, timeout, master_listen_fd=listener.detach())
    else:
        store = dist.TCPStore(address, port, world, False, timeout)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)
