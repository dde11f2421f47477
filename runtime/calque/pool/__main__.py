"""``python -m calque.pool --spec FILE [--index N] [overrides]``: a pool worker process.

It runs ``calque pool worker``'s command alone (``calque.cli.pool_worker``, then ``calque.pool.process``)
through ``calque.exits``, not through ``cli.main``'s whole command tree.
"""

import sys

from calque.cli.pool_worker import worker
from calque.exits import run_command

if __name__ == "__main__":
    sys.exit(run_command(worker, sys.argv[1:], "calque pool worker"))
