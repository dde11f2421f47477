"""The ``calque`` command: click groups, one module per verb group, thin over the runtime."""
