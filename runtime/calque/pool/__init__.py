"""Layer 1: the warm pool. The worker loop (``worker``), processes and signals (``process``),
submitting and reading runs (``submit``), the cost model (``cost``), the spot watcher (``spot``)
and Prometheus metrics (``metrics``). See ``calque.warm`` for the in-process supervisor API.
"""
