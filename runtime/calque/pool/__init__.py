"""Layer 1: the warm pool, in two rooms that never import each other: the worker (``worker/``: the
loop, its claims and leases, processes and their entry ``python -m calque.pool.worker``) and the
submitter (``submitter/``: submit, runs, staging, status, load reads, ramp). Their shared contracts
are in ``calque.models``; beside the rooms, what both use: the spec file (``spec``), how a worker is
started and finds its workload (``bootstrap``) and a claim's cost (``cost``)."""
