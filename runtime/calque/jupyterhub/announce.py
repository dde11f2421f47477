"""What the hub's pages say to a user about her notebook's session (issue 36, part 2): that it is about
to end (its time is up, or its slice sits idle on the GPU) and what keeps it, or why her last server
stopped. JupyterHub shows it as the page's announcement, computed per user at each page:

    from calque.jupyterhub.announce import session_notices
    c.JupyterHub.template_vars = {"announcement": session_notices}

The words are the spawner's, from its last ``poll()`` (``notice``, every ``poll_interval``) and from how
her last session ended (``last_end``). Nothing here asks the broker or a host: a page costs nothing.
"""

from __future__ import annotations

import html
from typing import Any


def session_notices(user: Any) -> str:
    """The announcement for ``user`` (JupyterHub's ``User``; None on the login page): escaped HTML, or
    the empty string when nothing is to be said. Her servers' spawners that are not calque's say nothing."""
    lines = []
    for spawner in list(getattr(user, "spawners", {}).values()) if user is not None else []:
        notice, ended = getattr(spawner, "notice", None), getattr(spawner, "last_end", None)
        if isinstance(notice, str) and notice:
            lines.append(f"Your notebook: {html.escape(notice)}.")
        elif isinstance(ended, str) and ended and not getattr(spawner, "session_id", None):
            lines.append(f"Your last server stopped: {html.escape(ended)}.")
    return '<span id="calque-notice">' + "<br>".join(lines) + "</span>" if lines else ""
