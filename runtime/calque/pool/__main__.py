"""``python -m calque.pool``: the worker's entry under its earlier name, kept for units and user-data
written before ``python -m calque.pool.worker`` (``calque.pool.worker.entry``) named it."""

import sys

from calque.pool.worker.entry import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
