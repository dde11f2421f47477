"""Replay a public production GPU trace through the real broker and host daemons (issue 37, parts 1-2).

``python -m bench.replay --trace PATH``: ``trace.py`` reads the trace, ``mapping.py`` turns its tasks into
an institution's requests (every choice printed), ``institution.py`` is the institution's shape,
``launch.py`` starts it (real daemons, a real broker, real Unix users), ``driver.py`` replays the
requests against it (``holders.py``: how a holder uses its slice, and the hosts' audit ends read after;
``reserve.py``: the fair-reserve row's class reservation), ``report.py`` prints the figures.

``python -m bench.replay.pools --trace PATH`` (parts 3-4): ``pool_demand.py`` turns the whole-GPU tasks
into a pool's claims and fits hour-of-week warmth on earlier weeks only, ``pool_group_sim.py`` runs an
Auto Scaling group on calque's own scaling documents, ``pool_modal.py`` models Modal, ``pool_figures.py``
holds the modelled figures with their sources, ``pools.py`` prints the table at both ends of each range.

``bench/mig_suggest.py`` (``mig_weeks.py``, ``mig_bench.py``) and ``bench/session_fleet.py``
(``fleet_sim.py``, ``fleet_bench.py``) run calque's ``suggest`` and its fleet scaling documents on the
trace (part 5); ``bench/idle_reclaim.py`` is this replay with reclaim off and on.
"""
