"""gpufleet: see every GPU of a heterogeneous fleet, alert on it, and measure its fragmentation."""

__version__ = "0.1.0"
