"""The TCP sockets a set of processes listens on, read from Linux's ``/proc`` (``/proc/net/tcp``, ``tcp6`` and each
process's file descriptors): what ``ss -ltnp`` shows, without needing it or root."""

from __future__ import annotations

import ipaddress
import os
import socket
from collections.abc import Iterable
from pathlib import Path

__all__ = ["children", "is_loopback", "listening"]

LISTEN = "0A"  # the kernel's TCP_LISTEN state, as /proc/net/tcp writes it


def _socket_inodes(pid: int) -> set[int]:
    inodes: set[int] = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:  # gone, or not ours
        return inodes
    for fd in fds:
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(int(link[len("socket:["):-1]))
    return inodes


def _address(hexadecimal: str, v6: bool) -> str:
    raw = bytes.fromhex(hexadecimal)
    if not v6:
        return socket.inet_ntop(socket.AF_INET, raw[::-1])
    return socket.inet_ntop(socket.AF_INET6, b"".join(raw[k:k + 4][::-1] for k in range(0, 16, 4)))


def listening(pids: Iterable[int]) -> list[tuple[int, str, int]]:
    """``(pid, address, port)`` of every TCP socket in the LISTEN state that one of ``pids`` holds."""
    owner = {inode: pid for pid in pids for inode in _socket_inodes(pid)}
    found = []
    for table, v6 in (("/proc/net/tcp", False), ("/proc/net/tcp6", True)):
        if not Path(table).exists():
            continue
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], int(fields[9])
            if state == LISTEN and inode in owner:
                host, port = local.split(":")
                found.append((owner[inode], _address(host, v6), int(port, 16)))
    return found


def children(pid: int) -> set[int]:
    """Every process descended from ``pid``."""
    parent: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            parent[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {p for p, q in parent.items() if q in frontier and p not in found}
        found |= frontier
    return found


def is_loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    mapped = getattr(ip, "ipv4_mapped", None)
    return ip.is_loopback or (mapped is not None and mapped.is_loopback)
