"""Session service (Layer 2): users check MIG slices and MPS slots out and in, as themselves.

``daemon`` serves a unix socket (callers identified by SO_PEERCRED), ``service`` decides,
``registry`` keeps sessions in SQLite, ``isolation`` hands out environments and capability nodes,
``enforcer`` runs the timers, ``audit`` keeps the JSONL trail, ``client`` is what the CLI uses.
"""
