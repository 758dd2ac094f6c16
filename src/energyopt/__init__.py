"""energyopt: energy-optimal operation of GPU fleets.

Decides where work runs, how each GPU's SMs are partitioned and at which clock
each GPU runs, so that energy is minimal while latency SLOs and power caps hold.
"""

__version__ = "0.1.0"
