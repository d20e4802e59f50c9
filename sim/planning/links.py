"""The links a plan names: a catalog link, or a family (``nvlink``, ``pcie``) resolved to the generation that comes
with the device, and the network between nodes (one port of it)."""

from __future__ import annotations

from sim.core.link import LinkSpec
from sim.planning.hardware.catalog import LINKS, DeviceSpec, get_link

__all__ = ["resolve_link", "resolve_network"]

_LINK_FAMILIES = {  # a family name picks the generation that comes with the device (first prefix that matches;
    # "" matches any). The PCIe and NVL H100 cards reach one peer over a bridge; an MI300 has no NVLink (name
    # its link, xgmi-mi300).
    "nvlink": {"v100": "nvlink2", "a100": "nvlink3", "h800": "nvlink4-h800", "h100-pcie": "nvlink4-bridge",
               "h100-nvl": "nvlink4-bridge",
               "h100": "nvlink4", "h200": "nvlink4", "b200": "nvlink5", "gb200": "nvlink5"},
    "pcie": {"tesla-p40": "pcie3-x16", "v100": "pcie3-x16", "a100": "pcie4-x16", "h100": "pcie5-x16",
             "h800": "pcie5-x16", "h200": "pcie5-x16", "b200": "pcie5-x16", "gb200": "pcie5-x16", "l40s": "pcie4-x16",
             "mi3": "pcie5-x16", "": "pcie4-x16"},
}


def resolve_link(name: str | LinkSpec, device: DeviceSpec) -> LinkSpec:
    """A catalog link, or the generation of a family (``nvlink``, ``pcie``) that comes with ``device``.

    Raises:
        KeyError: an unknown link, or a family the device does not have (the message lists the links).
    """
    if isinstance(name, LinkSpec):
        return name
    key = name.strip().lower()
    if key in LINKS:
        return get_link(key)
    family = _LINK_FAMILIES.get(key)
    if family is not None:
        for prefix, link in family.items():
            if device.name.startswith(prefix):
                return get_link(link)
        raise KeyError(f"device {device.name!r} has no {key}; name a link: {', '.join(LINKS)}")
    raise KeyError(f"unknown link {name!r}; known: {', '.join([*_LINK_FAMILIES, *LINKS])}")


def resolve_network(name: str | LinkSpec) -> LinkSpec:
    """A catalog link for the network between nodes (``infiniband-ndr``, ``roce-400g``, ...), one port of it.

    Raises:
        KeyError: an unknown name (the message lists the catalog's links).
    """
    if isinstance(name, LinkSpec):
        return name
    key = name.strip().lower()
    if key not in LINKS:
        raise KeyError(f"unknown network {name!r}; known: {', '.join(LINKS)}")
    return get_link(key)
