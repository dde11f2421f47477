"""The hub in a browser (issue 36, "Accept when", on this machine): a real JupyterHub with PAM and
calque's spawner, a real broker and host daemon over TCP with real munge, a simulated RTX PRO 6000
with one ``1g.24gb`` slice, two created users with passwords, and headless Chromium.

Alice logs in through the hub's login page, picks ``1g.24gb`` on the form, sees the progress page,
reaches JupyterLab and runs a notebook cell (typed into the notebook and run with Shift+Enter) that
prints its ``CUDA_VISIBLE_DEVICES``, uid and cgroup; they are the slice, the user and the session's
scope that ``calque session list --all`` shows. Bob, with cookies of his own in the same browser, asks for the
same profile, sees his place in the queue on the progress page, and gets the slice when Alice stops
her server from the hub's home page. His session's short TTL runs out: the server ends with it and the
hub shows it stopped, with the reason on his next form. Screenshots go to build/test-artifacts/.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.waits import HANG_S

from .conftest import VENV_PY, User, wait_for
from .hub_browser import (
    ARTIFACTS,
    CHROMEDRIVER,
    CHROMIUM,
    PROXY,
    CookieJars,
    chromium,
    jupyterhub,
    set_password,
)
from .institution import Broker, institution, over_tcp
from .test_isolation import cgroup_parent  # noqa: F401 (a fixture)
from .test_jupyterhub_spawner import _home, _log

pytest.importorskip("jupyterhub")
pytest.importorskip("selenium")
from selenium.common.exceptions import (
    ElementClickInterceptedException,
    NoSuchElementException,
    StaleElementReferenceException,
)
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import Select, WebDriverWait

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("munged") is None, reason="munge is not installed"),
    pytest.mark.skipif(
        None in (CHROMIUM, CHROMEDRIVER, PROXY),
        reason="no chromium, chromedriver or configurable-http-proxy: scripts/prerequisites browser",
    ),
]

RTX_PRO = ("RTX-PRO-6000-Blackwell-Server-Edition", "1g.24gb")
# One line: typed key by key, each closing bracket and quote types over the one the editor inserted.
CELL = (
    'import os, json; print(json.dumps({"cuda": os.environ.get("CUDA_VISIBLE_DEVICES"), "uid": os.getuid(), '
    '"session": os.environ.get("CALQUE_SESSION_ID"), "cgroup": open("/proc/self/cgroup").read().strip()}))'
)
BOB_TTL = "90s"  # long enough for his server to start on a loaded machine, short enough to watch it expire


def _wait(driver: Any) -> WebDriverWait:
    return WebDriverWait(driver, HANG_S, poll_frequency=0.2)  # a ceiling only a hang reaches


def _click(driver: Any, css: str) -> None:
    """Click ``css`` once it is there and clickable; JupyterLab re-renders as it loads, so an element
    found may be replaced before the click lands: then it is found again."""

    def clicked(d: Any) -> bool:
        el = d.find_element(By.CSS_SELECTOR, css)
        if not (el.is_displayed() and el.is_enabled()):
            return False
        el.click()
        return True

    missing = (NoSuchElementException, StaleElementReferenceException, ElementClickInterceptedException)
    WebDriverWait(driver, HANG_S, poll_frequency=0.2, ignored_exceptions=missing).until(clicked)


def _shot(driver: Any, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    driver.save_screenshot(str(path))
    return path


def _log_in(driver: Any, hub_url: str, user: User, password: str) -> None:
    driver.get(f"{hub_url}/hub/login")
    _wait(driver).until(ec.element_to_be_clickable((By.ID, "username_input"))).send_keys(user.name)
    driver.find_element(By.ID, "password_input").send_keys(password)
    driver.find_element(By.ID, "login_submit").click()


def _ask_for(driver: Any, profile: str, ttl: str) -> None:
    """On the options form: the profile and TTL chosen, Start pressed."""
    form = _wait(driver).until(ec.presence_of_element_located((By.ID, "spawn_form")))
    Select(form.find_element(By.ID, "profile")).select_by_value(profile)
    box = form.find_element(By.ID, "ttl")
    box.clear()
    box.send_keys(ttl)
    form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()


def _progress_log(driver: Any) -> str:
    return str(driver.find_element(By.ID, "progress-log").get_attribute("textContent"))


def _open_progress(driver: Any, says: str) -> None:
    """The progress page, its event log opened, once it says ``says``."""
    _wait(driver).until(ec.url_contains("/hub/spawn-pending/"))
    driver.find_element(By.CSS_SELECTOR, "#progress-details summary").click()
    _wait(driver).until(lambda d: says in _progress_log(d))


def _run_cell(driver: Any, user: User) -> dict[str, Any]:
    """A new notebook from JupyterLab's launcher, the cell typed and run; what it printed."""
    _wait(driver).until(ec.url_contains(f"/user/{user.name}/lab"))
    _click(driver, '.jp-LauncherCard[data-category="Notebook"]')
    # its kernel started (JupyterLab drops a cell run before the notebook has its kernel)
    idle = "//*[contains(@class, 'jp-StatusBar-TextItem') and contains(text(), '| Idle')]"
    _wait(driver).until(ec.presence_of_element_located((By.XPATH, idle)))
    _click(driver, ".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Cell .cm-content")
    driver.switch_to.active_element.send_keys(CELL)
    driver.switch_to.active_element.send_keys(Keys.SHIFT, Keys.ENTER)
    output = ".jp-NotebookPanel:not(.lm-mod-hidden) .jp-OutputArea-output"
    text = _wait(driver).until(lambda d: "".join(e.text for e in d.find_elements(By.CSS_SELECTOR, output)).strip())
    printed: dict[str, Any] = json.loads(text)
    return printed


def _held(broker: Broker, user: User) -> dict[str, Any]:
    """The slice ``user`` holds in ``calque session list --all --json`` (the broker's view, as root),
    once the broker has seen it there."""

    def holding() -> dict[str, Any] | None:
        res = broker.cli(None, "session", "list", "--all", "--json")
        assert res.returncode == 0, res.stderr
        return next((s for v in json.loads(res.stdout) for s in v["slices"] if s.get("holder") == user.name), None)

    assert wait_for(lambda: holding() is not None, every=0.5), f"the broker never showed {user.name} holding a slice"
    held = holding()
    assert held is not None
    return held


def test_researchers_get_jupyterlab_on_a_slice_through_the_hub_in_a_browser(
    make_user: Callable[..., User],
    cgroup_parent: Path,  # noqa: F811
) -> None:
    with institution(make_user, {"hostA": 1}, mig=RTX_PRO) as broker:
        host = broker.hosts["hostA"]
        command = [*host.python, "-m", "jupyterhub.singleuser", "--ip={ip}", "--port={port}"]
        host.config.update(cgroups="direct", cgroup_parent=str(cgroup_parent), notebook_command=command)
        if "PYTHONPATH" in host.env:  # the users' python reaches the venv's packages through it
            venv = VENV_PY.parent.parent  # and Jupyter its extensions' config and JupyterLab's assets
            host.config["notebook_env"] = {
                "PYTHONPATH": host.env["PYTHONPATH"],
                "JUPYTER_CONFIG_PATH": str(venv / "etc/jupyter"),
                "JUPYTER_PATH": str(venv / "share/jupyter"),
                "JUPYTERLAB_DIR": str(venv / "share/jupyter/lab"),
            }
        with over_tcp(broker, hub="root"):
            broker.start()
            alice, bob = make_user(), make_user()
            passwords = {}
            for u in (alice, bob):
                _home(u)
                passwords[u.name] = set_password(u)
            spawner = {"max_ttl": "2h", "default_ttl": "1h", "queue_poll": 0.5, "poll_interval": 2}
            with jupyterhub(broker, [alice, bob], **spawner) as hub, chromium() as driver:
                try:
                    _story(broker, hub, driver, cgroup_parent, alice, bob, passwords)
                except Exception:
                    _shot(driver, "failure")
                    print(f"hub log:\n{hub.log()}\nbroker log:\n{broker.log()[-3000:]}\n{_log(alice)}\n{_log(bob)}")
                    raise
            print(f"screenshots: {ARTIFACTS}")


def _story(
    broker: Broker, hub: Any, driver: Any, scopes: Path, alice: User, bob: User, passwords: dict[str, str]
) -> None:
    # Alice: the login page, the form (what is free now), the progress page, JupyterLab, a cell.
    jars = CookieJars(driver)
    jars.use(alice.name)
    _log_in(driver, hub.url, alice, passwords[alice.name])
    _wait(driver).until(ec.presence_of_element_located((By.ID, "spawn_form")))
    form = driver.find_element(By.ID, "spawn_form").text
    assert "1g.24gb: 1 of 1 free" in form, form
    _shot(driver, "1-form")
    _ask_for(driver, "1g.24gb", "1h")
    _open_progress(driver, "JupyterLab starting on hostA")
    _shot(driver, "2-progress")
    printed = _run_cell(driver, alice)
    _shot(driver, "3-notebook")
    held = _held(broker, alice)
    assert printed["uid"] == alice.uid
    assert printed["cuda"] == held["slice"]["mig_uuid"] and held["slice"]["profile"] == "1g.24gb"
    assert printed["session"] == held["session_id"]
    # the session's scope: its cgroup under the host's cgroup parent, named by its id (cgroup v2's line)
    assert f"0::/{scopes.name}/{held['session_id']}" in printed["cgroup"].splitlines(), printed

    # Bob, with cookies of his own: the same profile, none free: his place in the queue.
    jars.use(bob.name)
    _log_in(driver, hub.url, bob, passwords[bob.name])
    _wait(driver).until(ec.presence_of_element_located((By.ID, "spawn_form")))
    assert "none free" in driver.find_element(By.ID, "spawn_form").text
    _ask_for(driver, "1g.24gb", BOB_TTL)
    _open_progress(driver, "waiting in the institution's queue: place 1")
    _shot(driver, "4-queue-place")

    # Alice stops her server on the hub's home page: the slice is checked in, and Bob's (his server
    # goes on starting without his page, and without JupyterLab's weight in the browser).
    jars.use(alice.name)
    driver.get(f"{hub.url}/hub/home")

    def stopped(d: Any) -> bool:
        # The button works once the page's script (loaded after the page) has wired it: until her
        # server is gone she presses it again, as a person would when nothing happens.
        if hub.server(alice) is None:
            return True
        d.find_element(By.ID, "stop").click()
        return False

    missing = (NoSuchElementException, StaleElementReferenceException, ElementClickInterceptedException)
    WebDriverWait(driver, HANG_S, poll_frequency=1.0, ignored_exceptions=missing).until(stopped)
    assert wait_for(lambda: (s := hub.server(bob)) is not None and s["ready"]), (hub.server(bob), hub.log())
    assert _held(broker, bob)["slice"]["profile"] == "1g.24gb"

    # His session's TTL runs out: the server ends with it, the hub shows it stopped and why.
    assert wait_for(lambda: hub.server(bob) is None), hub.log()
    jars.use(bob.name)
    driver.get(f"{hub.url}/hub/spawn")
    form = _wait(driver).until(ec.presence_of_element_located((By.ID, "spawn_form"))).text
    _shot(driver, "5-expired")
    assert "expired" in form and "hostA" in form, form
    driver.get(f"{hub.url}/hub/home")  # the Hub Control Panel says it too (calque.jupyterhub.announce)
    home = _wait(driver).until(ec.presence_of_element_located((By.ID, "calque-notice"))).text
    _shot(driver, "6-home-notice")
    assert home.startswith("Your last server stopped: session ") and "expired" in home, home
