"""Replay a public production GPU trace through the real broker and host daemons (issue 37, parts 1-2).

``python -m bench.replay --trace PATH``: ``trace.py`` reads the trace, ``mapping.py`` turns its tasks into
an institution's requests (every choice printed), ``institution.py`` is the institution's shape,
``launch.py`` starts it (real daemons, a real broker, real Unix users), ``driver.py`` replays the
requests against it, ``report.py`` prints the figures.
"""
