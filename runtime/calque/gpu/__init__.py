"""The GPU layer (Layer 2): catalog, backends (NVML and simulator), MIG layouts, MPS daemons."""
