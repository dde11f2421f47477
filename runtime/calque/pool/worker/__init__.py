"""A pool's worker: the loop that claims, runs and summarises (``loop``), its process and entry
(``process``, ``entry``, ``python -m calque.pool.worker``). Never imports ``pool/submitter/`` or ``cli/``."""
