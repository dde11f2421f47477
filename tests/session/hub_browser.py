"""A real JupyterHub on 127.0.0.1 and a headless Chromium to drive it (tests/session/test_notebook_browser.py).

The hub is the ``jupyterhub`` of the project's venv, run as root (PAM checks the users' passwords in
/etc/shadow), with its real proxy (Debian's ``node-configurable-http-proxy``), ``PAMAuthenticator``
and calque's spawner by its entry point name; the browser is Debian's ``chromium`` driven through
Debian's ``chromedriver`` (``scripts/prerequisites browser``): nothing is downloaded. One browser
serves several users, each with her own cookies swapped in while she uses it (``CookieJars``), as two
people's browsers would; one browser costs half what two would.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import textwrap
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from support.waits import HANG_S

from .conftest import REPO, VENV_PY, User, wait_for
from .institution import Broker, free_port

CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")
# Debian's Node proxy, named by path: .venv/bin (first on scripts/test's PATH) has the Python one, which reads
# each response whole before passing it on, so the hub's progress page (an event stream) would stay empty.
PROXY = shutil.which("configurable-http-proxy", path="/usr/bin")
ARTIFACTS = REPO / "build/test-artifacts/notebook-browser"


def set_password(user: User) -> str:
    """A password for ``user`` (chpasswd), for the hub's login page."""
    password = secrets.token_urlsafe(12)
    subprocess.run(["chpasswd"], input=f"{user.name}:{password}\n", text=True, check=True, capture_output=True)
    return password


@dataclass
class Hub:
    dir: Path
    url: str  # the proxy's public URL, what the browser opens
    api_token: str  # a service's token with the admin scopes the test reads users' servers with
    proc: subprocess.Popen[bytes] | None = None
    spawner: dict[str, Any] = field(default_factory=dict)

    def api(self, path: str) -> Any:
        req = urllib.request.Request(f"{self.url}/hub/api{path}", headers={"Authorization": f"token {self.api_token}"})
        with urllib.request.urlopen(req, timeout=HANG_S) as r:
            return json.loads(r.read())

    def server(self, user: User) -> dict[str, Any] | None:
        """Her default server as the hub's API shows it (None: no server, stopped)."""
        doc = self.api(f"/users/{user.name}")
        server: dict[str, Any] | None = doc["servers"].get("")
        return server

    def log(self) -> str:
        p = self.dir / "hub.log"
        return p.read_text()[-6000:] if p.exists() else "no hub log"


def _config(broker: Broker, users: list[User], port: int, token: str, spawner: dict[str, Any]) -> str:
    settings = {
        "institution": str(broker.dir / "institution.yaml"),
        "broker_socket": str(broker.socket),
        "munge_socket": str(broker.config["munge_socket"]),
        **spawner,
    }
    return textwrap.dedent(
        f"""
        c.JupyterHub.bind_url = "http://127.0.0.1:{port}"
        c.JupyterHub.hub_ip = "127.0.0.1"
        c.JupyterHub.hub_port = {free_port()}
        c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{free_port()}"
        c.ConfigurableHTTPProxy.command = ["{PROXY}"]
        c.JupyterHub.db_url = "sqlite:///jupyterhub.sqlite"
        c.JupyterHub.cookie_secret_file = "cookie_secret"
        c.JupyterHub.authenticator_class = "pam"
        c.PAMAuthenticator.open_sessions = False  # the server runs on a session host, not here
        c.Authenticator.allowed_users = {sorted(u.name for u in users)!r}
        c.JupyterHub.spawner_class = "calque"  # the jupyterhub.spawners entry point
        from calque.jupyterhub.announce import session_notices
        c.JupyterHub.template_vars = {{"announcement_home": session_notices}}  # her session's notices, at home
        c.JupyterHub.tornado_settings = {{"slow_spawn_timeout": 0}}  # the progress page at once, as for a queue
        c.Spawner.http_timeout = {HANG_S:.0f}  # the server's first answer, on a loaded machine
        c.JupyterHub.services = [{{"name": "calque-test", "api_token": {token!r}}}]
        c.JupyterHub.load_roles = [
            {{"name": "calque-test", "scopes": ["admin:users", "admin:servers"], "services": ["calque-test"]}}
        ]
        for key, value in {settings!r}.items():
            setattr(c.CalqueSpawner, key, value)
        """
    )


@contextmanager
def jupyterhub(broker: Broker, users: list[User], **spawner: Any) -> Iterator[Hub]:
    """The hub, answering on its public URL when this yields; stopped (its servers with it) after."""
    d = broker.dir / "hub"
    d.mkdir(mode=0o700)
    port, token = free_port(), secrets.token_hex(16)
    (d / "jupyterhub_config.py").write_text(_config(broker, users, port, token, spawner))
    hub = Hub(dir=d, url=f"http://127.0.0.1:{port}", api_token=token, spawner=spawner)
    env = {
        **os.environ,
        "PYTHONPATH": f"{REPO / 'runtime'}:{os.environ.get('PYTHONPATH', '')}",  # this checkout's calque
        # Debian's proxy finds its modules in /usr/share/nodejs (a node from elsewhere does not look there)
        "NODE_PATH": "/usr/share/nodejs",
    }
    log = (d / "hub.log").open("ab")
    hub.proc = subprocess.Popen(
        [str(VENV_PY.parent / "jupyterhub"), "-f", "jupyterhub_config.py"],
        cwd=d,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:

        def answers() -> bool:
            assert hub.proc is not None and hub.proc.poll() is None, hub.log()
            try:
                with urllib.request.urlopen(f"{hub.url}/hub/api", timeout=HANG_S) as r:
                    return r.status == 200
            except (urllib.error.URLError, OSError):
                return False

        assert wait_for(answers, every=0.2), f"the hub did not answer: {hub.log()}"
        yield hub
    finally:
        hub.proc.send_signal(signal.SIGTERM)  # the hub stops its servers (cleanup_servers): each checked in
        try:
            hub.proc.wait(HANG_S)
        except subprocess.TimeoutExpired:
            os.killpg(hub.proc.pid, signal.SIGKILL)
            hub.proc.wait(HANG_S)


@contextmanager
def chromium() -> Iterator[Any]:
    """Headless Chromium under selenium, with Debian's chromedriver (no Selenium Manager, no download)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    assert CHROMIUM is not None and CHROMEDRIVER is not None
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",  # root in a container: Chromium's own sandbox cannot start
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--disable-extensions",
        "--no-first-run",
        "--window-size=1280,900",
    ):
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))
    driver.set_page_load_timeout(HANG_S)
    try:
        yield driver
    finally:
        driver.quit()


class CookieJars:
    """One browser for several people: each one's cookies in the browser while she uses it, the others'
    put aside (DevTools' cookie calls: every cookie of every path, httpOnly ones included)."""

    # what Network.setCookies takes of what Network.getAllCookies gives
    KEYS = ("name", "value", "domain", "path", "secure", "httpOnly", "sameSite", "expires", "priority")

    def __init__(self, driver: Any) -> None:
        self.driver = driver
        self.jars: dict[str, list[dict[str, Any]]] = {}
        self.current: str | None = None

    def use(self, who: str) -> None:
        d = self.driver
        d.get("about:blank")  # no page of the last person's goes on asking with the next one's cookies
        if self.current is not None:
            self.jars[self.current] = d.execute_cdp_cmd("Network.getAllCookies", {})["cookies"]
        d.execute_cdp_cmd("Network.clearBrowserCookies", {})
        jar = [
            {k: c[k] for k in self.KEYS if k in c and not (k == "expires" and c.get("session"))}
            for c in self.jars.get(who, [])
        ]
        if jar:
            d.execute_cdp_cmd("Network.setCookies", {"cookies": jar})
        self.current = who
