"""``python -m calque.pool worker --spec FILE``: the ``calque pool`` group, for subprocesses."""

import sys

from calque.cli.main import main

if __name__ == "__main__":
    sys.argv = ["calque", "pool", *sys.argv[1:]]
    main()
