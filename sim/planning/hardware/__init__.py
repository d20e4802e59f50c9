"""Hardware: devices, links and whole systems with their sources, and the roofline that times a kernel on a device.

:mod:`~sim.planning.hardware.catalog` holds the devices and links, :mod:`~sim.planning.hardware.systems` whole
machines (a node's GPUs, link and network), and :mod:`~sim.planning.hardware.roofline` a device's roofline per kind
of kernel.
"""
