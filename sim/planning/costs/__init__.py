"""Costs: a counted model priced on a device, and the device's roofline measured on this machine.

:mod:`~sim.planning.costs.from_flops` divides a profile's counts by a device into the core's cost model (with
:mod:`~sim.planning.costs.op_arrays`, its operators as arrays); :mod:`~sim.planning.costs.calibrate_device` and
:mod:`~sim.planning.costs.calibrate_split` time this CPU's kernels and :mod:`~sim.planning.costs.roofline_fit` fits a
roofline to them.
"""
