"""Run a Modal-shaped script warm: load it once, ``@enter`` once, drain many batches, ``@exit`` once.

In-process API (used by ``calque pool worker`` and by ``calque ramp``)::

    from calque.warm import WarmSupervisor
    from calque.models import Item, PoolSpec

    sup = WarmSupervisor.load(spec)                  # a PoolSpec, or "script.py::Class" (+ parameters=)
    sup.enter_seconds, sup.enter_count, sup.digest   # what @enter cost; 1; the workload_digest
    results = sup.run("generate", [Item(index=0, args=["hi"])])   # -> list[ItemResult], item order
    drain = sup.drain("generate", items, should_stop=lambda: None) # results + method_seconds + stopped
    sup.close()                                      # runs @exit once; returns hook errors

``load`` raises ``WorkloadError`` (the script cannot run here: the message names the construct and
line) or ``EnterError`` (``@enter`` raised). Per-item failures never raise: they are ItemResults with
``ok=False`` and an ``ItemError`` (type, message, traceback).

To run a worker *process* against a spec (what systemd runs), use
``calque.pool.worker.worker_process.start_worker_process(spec_path, env=..., index=...)`` (a ``subprocess.Popen``
of ``python -m calque.pool.worker --spec FILE``), or the CLI ``calque pool worker --spec FILE``.
The stand-in ``modal`` module is put in place only inside the process that loads a workload.
"""

from calque.warm.drain_results import Drain
from calque.warm.loader import Workload, WorkloadError, load_workload, workload_digest
from calque.warm.supervisor import EnterError, WarmSupervisor

__all__ = ["Drain", "EnterError", "WarmSupervisor", "Workload", "WorkloadError", "load_workload", "workload_digest"]
