"""A pool's submitter: claims sent and waited for (``submit``, ``runs``, ``stage``), what ``calque pool
status`` reads (``status``, ``load_reads``), load records (``loads``), ``calque ramp``. Never imports
``pool/worker/``."""
