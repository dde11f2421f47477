"""Prometheus text exposition: slices free/busy per profile, live sessions per user."""

from __future__ import annotations

import os
import threading
from collections import Counter
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from calque.models.session import Slice
from calque.session.registry import Held


def _label(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def render(slices: list[Slice], live: list[Held], counters: dict[str, int]) -> str:
    busy_ids = {h.session.slice_id for h in live}
    per: dict[tuple[str, str, str], int] = {}
    for sl in slices:
        for state in ("free", "busy"):
            per.setdefault((sl.kind, sl.profile, state), 0)
        per[(sl.kind, sl.profile, "busy" if sl.id in busy_ids else "free")] += 1
    lines = [
        "# HELP calque_session_slices Slices on this host by kind, profile and state.",
        "# TYPE calque_session_slices gauge",
    ]
    for (kind, profile, state), n in sorted(per.items()):
        lines.append(f'calque_session_slices{{kind="{kind}",profile="{_label(profile)}",state="{state}"}} {n}')
    users: Counter[str] = Counter(h.session.user for h in live)
    lines += [
        "# HELP calque_session_sessions Live sessions per user.",
        "# TYPE calque_session_sessions gauge",
    ]
    for user, n in sorted(users.items()):
        lines.append(f'calque_session_sessions{{user="{_label(user)}"}} {n}')
    lines += [
        "# HELP calque_session_events_total Session lifecycle events since the daemon started.",
        "# TYPE calque_session_events_total counter",
    ]
    for event, n in sorted(counters.items()):
        lines.append(f'calque_session_events_total{{event="{event}"}} {n}')
    return "\n".join(lines) + "\n"


def write_textfile(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def serve_http(port: int, produce: Callable[[], str]) -> ThreadingHTTPServer:
    """GET /metrics on 127.0.0.1:<port> in a background thread."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.split("?")[0] not in ("/metrics", "/"):
                self.send_error(404)
                return
            body = produce().encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return server
