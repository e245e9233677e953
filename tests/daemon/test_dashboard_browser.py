"""The dashboard in a real browser: Debian's Chromium, driven through Debian's chromedriver.

A real daemon on the simulated market (preemptions within seconds); the test
logs in with the token, submits a job with the real ``spotd submit``, sees it
appear in the jobs table without reloading the page (the page's own polling),
watches its status change, and on its page sees a second attempt after a
preemption. It takes a screenshot of every page; with ``SPOTD_SCREENSHOTS=DIR``
they are written there (``docs/images`` for the README's), else to a
temporary folder.

Skipped, with the reason, where Chromium, chromedriver or Selenium is missing
(``make test`` installs all three where it is root on Debian). Selenium is
given chromedriver's path, so its selenium-manager never downloads a driver.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import matplotlib.image
import pytest
from daemon_support import Daemon, Setup
from dashboard_support import api_token, base_url, dashboard_setup

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (apt-get install "
                       "chromium)"),
    pytest.mark.skipif(CHROMEDRIVER is None, reason="chromedriver is not installed (apt-get "
                       "install chromium-driver)"),
]  # fmt: skip

from selenium.common.exceptions import StaleElementReferenceException  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

WIDTH = 1400


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Any]:
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in (
        "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
        "--no-first-run", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--disable-default-apps", f"--user-data-dir={tmp_path / 'profile'}",
        f"--window-size={WIDTH},1000", "--hide-scrollbars",
    ):  # fmt: skip
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def running(tmp_path: Path) -> Iterator[Setup]:
    setup = dashboard_setup(tmp_path, seed=5)
    daemon = Daemon(setup)
    try:
        yield setup
    finally:
        assert daemon.stop() == 0


def shots_dir(tmp_path: Path) -> Path:
    wanted = os.environ.get("SPOTD_SCREENSHOTS")
    folder = Path(wanted) if wanted else tmp_path / "shots"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def shoot(driver: Any, folder: Path, name: str) -> Path:
    """The whole page as a PNG: the window made as tall as the page, then captured."""
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(WIDTH, min(max(int(height) + 40, 600), 4000))
    time.sleep(0.3)  # let the new size lay out
    path = folder / f"dashboard-{name}.png"
    driver.save_screenshot(str(path))
    driver.set_window_size(WIDTH, 1000)
    pixels = matplotlib.image.imread(path)
    assert pixels.std() > 0.05, f"{path} is blank"
    return path


def until(driver: Any, what: Callable[[Any], Any], timeout: float = 60) -> Any:
    """Wait for ``what``; the parts the page swaps in may go stale while it is read."""
    wait = WebDriverWait(driver, timeout, poll_frequency=0.1,
                         ignored_exceptions=(StaleElementReferenceException,))  # fmt: skip
    return wait.until(what)


def status_of(driver: Any, row: str) -> str | None:
    """The status of the jobs table's row ``row``, None while it is being swapped."""
    try:
        rows = driver.find_elements(By.CSS_SELECTOR, row)
        return rows[0].get_attribute("data-status") if rows else None
    except StaleElementReferenceException:
        return None


def test_log_in_watch_a_submitted_job_and_its_recovery(
    browser: Any, running: Setup, tmp_path: Path
) -> None:
    base = base_url(running)
    shots = shots_dir(tmp_path)

    # No session: the jobs page sends the browser to the login page, which comes back to it.
    browser.get(f"{base}/dashboard/jobs")
    until(browser, lambda d: "/dashboard/login" in d.current_url)
    shoot(browser, shots, "login")
    browser.find_element(By.ID, "token").send_keys("not-the-token")
    browser.find_element(By.ID, "login").click()
    until(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "p.error"))
    assert "not this daemon's token" in browser.find_element(By.CSS_SELECTOR, "p.error").text
    browser.find_element(By.ID, "token").send_keys(api_token(running))
    browser.find_element(By.ID, "login").click()
    until(browser, lambda d: d.current_url == f"{base}/dashboard/jobs")
    assert "No job yet" in browser.find_element(By.ID, "jobs").text

    # Chromium took the Secure cookie on http://127.0.0.1 (loopback is a secure context).
    (session,) = [c for c in browser.get_cookies() if c["name"] == "spotd_session"]
    assert session["secure"] and session["httpOnly"] and session["sameSite"] == "Strict"
    assert api_token(running) not in session["value"]

    # A job submitted through the CLI shows up by the page's polling: no reload.
    browser.execute_script("window.spotdNoReload = true;")
    job_id = json.loads(running.cli("submit", str(running.job_file), "--json").stdout)["id"]
    row = f'tr[data-job="{job_id}"]'
    until(browser, lambda d: d.find_elements(By.CSS_SELECTOR, row))
    seen = set()
    limit = time.monotonic() + 60
    while len(seen) < 2 and time.monotonic() < limit:
        status = status_of(browser, row)
        if status is not None:
            seen.add(status)
        time.sleep(0.1)
    assert len(seen) >= 2, f"the row's status never changed: {seen}"
    assert browser.execute_script("return window.spotdNoReload === true;"), "the page reloaded"
    shoot(browser, shots, "jobs")

    # The job's page: a second attempt after a preemption, on the table and the timeline.
    browser.find_element(By.CSS_SELECTOR, f"{row} a").click()
    until(browser, lambda d: d.current_url.endswith(f"/dashboard/jobs/{job_id}"))
    until(browser, lambda d: d.find_elements(By.CSS_SELECTOR, 'tr[data-end="preempted"]'), 90)
    until(browser, lambda d: int(d.find_element(By.ID, "attempt-count").text) >= 2)
    first = until(browser, lambda d: d.find_element(
        By.CSS_SELECTOR, 'tr[data-end="preempted"]').get_attribute("data-seq"))  # fmt: skip
    later = int(first) + 1
    until(browser, lambda d: d.find_elements(By.CSS_SELECTOR, f'tr[data-seq="{later}"]'))
    until(browser, lambda d: d.execute_script(
        "const i = document.querySelector('img.timeline'); return i.complete && i.naturalWidth > 0;"
    ))  # fmt: skip
    until(browser, lambda d: d.find_element(By.ID, "job-status").text == "succeeded", 120)
    time.sleep(2.5)  # one more refresh: the finished job's timeline and output
    shoot(browser, shots, "job")

    browser.get(f"{base}/dashboard/cost")  # the report is built behind the page, then shown
    spend = until(browser, lambda d: d.find_element(By.ID, "spend").text)
    assert spend.endswith(" USD") and float(spend.split()[0].replace(",", "")) > 0
    until(browser, lambda d: d.execute_script(
        "return [...document.querySelectorAll('.charts img')].every(i => i.naturalWidth > 0);"
    ))  # fmt: skip
    shoot(browser, shots, "cost")

    browser.get(f"{base}/dashboard/market?gpu=A100")
    offered = browser.find_elements(By.CSS_SELECTOR, "table.offerings tbody tr")
    assert offered and all("A100" in r.text for r in offered)
    shoot(browser, shots, "market")
    browser.find_element(By.CSS_SELECTOR, "table.offerings tbody tr a").click()
    until(browser, lambda d: d.execute_script(
        "const i = document.querySelector('img.history'); return i.complete && i.naturalWidth > 0;"
    ))  # fmt: skip
    shoot(browser, shots, "pool")

    # Logging out ends the session: the pages send the browser to the login again.
    browser.get(f"{base}/dashboard/jobs")
    browser.find_element(By.CSS_SELECTOR, "form.logout button").click()
    until(browser, lambda d: "/dashboard/login" in d.current_url)
    browser.get(f"{base}/dashboard/market")
    assert "/dashboard/login" in browser.current_url
