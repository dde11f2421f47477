"""``calque run SCRIPT``: a Modal script's local entrypoint on the submitter, its remote calls on pools.

- ``script``: import the script with the stand-in ``modal`` (this process only), pick and call the
  entrypoint, report;
- ``args``: the entrypoint's command-line arguments, from its signature, the way ``modal run`` does;
- ``proxies``: what ``Model().method`` and an ``@app.function`` are on the submitter
  (``.remote``, ``.map``, ``.starmap``, ``.spawn``, ``.local``, ``.aio``);
- ``pools`` (which pool serves a class) and ``pool_backend`` (claims through the pool's queue);
  ``local_backend`` (``--local``: everything in-process);
- ``outcome``: results back into values and exceptions (``RemoteError``); ``progress``: the tally.
"""
