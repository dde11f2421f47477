"""moto_server with one defect of moto's SQS taken out, for staging benchmarks.

    python bench/moto_linear.py -H 127.0.0.1 -p PORT

moto 5.2's ``SendMessage`` reads ``queue.attributes`` to learn whether the queue deduplicates by
content; building that dict counts the queue's messages (``ApproximateNumberOfMessages*``), walking
every message with two clock reads each. One send then costs O(queue depth), and staging N claims
O(N^2): the first 1,000 messages of a queue take 7.6 s here, the third 1,000 36 s. Real SQS has no
such cost. While a send runs, this launcher answers ``queue.attributes`` with the only key a send
reads (``ContentBasedDeduplication``, present on FIFO queues only, as moto itself does); everything
else, GetQueueAttributes included, is moto unchanged. Only benchmarks use it; tests use stock moto.
"""

from __future__ import annotations

import threading
from typing import Any

from moto.server import main
from moto.sqs import models

_sending = threading.local()
_attributes = models.Queue.attributes  # the property moto defines
_send = models.SQSBackend.send_message


def _cheap_attributes(queue: models.Queue) -> dict[str, Any]:
    if not getattr(_sending, "active", False):
        return _attributes.fget(queue)  # type: ignore[no-any-return]
    if not queue.fifo_queue:
        return {}
    value = queue.content_based_deduplication
    return {"ContentBasedDeduplication": str(value).lower() if isinstance(value, bool) else value}


def _send_message(self: models.SQSBackend, *args: Any, **kwargs: Any) -> Any:
    _sending.active = True
    try:
        return _send(self, *args, **kwargs)
    finally:
        _sending.active = False


models.Queue.attributes = property(_cheap_attributes)  # type: ignore[method-assign,assignment]
models.SQSBackend.send_message = _send_message  # type: ignore[method-assign]

if __name__ == "__main__":
    main()
