"""``python -m calque.pool.worker --spec FILE [--index N] [overrides]``: a pool worker process."""

import sys

from calque.pool.worker.entry import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
