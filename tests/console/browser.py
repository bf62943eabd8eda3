"""Debian's Chromium, headless, driven by Selenium through Debian's chromedriver.

Both come from apt (``chromium``, ``chromium-driver``: ``scripts/setup.sh``); the paths are
given to Selenium so that it never looks for a driver or a browser to download.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import pytest

T = TypeVar("T")

CHROMIUM = ("/usr/bin/chromium", "chromium")
DRIVER = ("/usr/bin/chromedriver", "chromedriver")
#: the window every screenshot is taken in
WINDOW = (1280, 900)


def _which(names: tuple[str, ...]) -> str | None:
    for name in names:
        found = shutil.which(name) or (name if Path(name).is_file() else None)
        if found:
            return found
    return None


def require_browser() -> tuple[str, str]:
    """Chromium and chromedriver, or the test fails saying how to install them."""
    browser, driver = _which(CHROMIUM), _which(DRIVER)
    if browser is None or driver is None:
        pytest.fail(
            "Chromium or chromedriver missing: `make setup` installs Debian's chromium, chromium-driver"
        )
    return browser, driver


@contextmanager
def chromium(downloads: Path) -> Iterator[Any]:
    """A headless Chromium that saves downloads in ``downloads``; quit on exit."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    browser, driver = require_browser()
    opts = webdriver.ChromeOptions()
    opts.binary_location = browser
    for arg in (
        "--headless=new",
        "--no-sandbox",  # root, as CI runs
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--no-first-run",
        f"--window-size={WINDOW[0]},{WINDOW[1]}",
    ):
        opts.add_argument(arg)
    opts.add_experimental_option(
        "prefs",
        {
            "download.default_directory": str(downloads),
            "download.prompt_for_download": False,
            "safebrowsing.enabled": False,
        },
    )
    d = webdriver.Chrome(service=Service(executable_path=driver), options=opts)
    # headless Chromium takes its download folder from the DevTools protocol
    d.execute_cdp_cmd(
        "Page.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(downloads)}
    )
    try:
        yield d
    finally:
        d.quit()


def wait_until(d: Any, what: str, probe: Callable[[Any], T], timeout: float = 120.0) -> T:
    """Poll ``probe(driver)`` until it is truthy (Selenium's wait); fail saying ``what``.

    An element the probe found that the page replaced before the probe read it (the console
    redraws its sections every few seconds: a stale element reference) counts as not yet, as
    an element not found does: the next poll finds the new one."""
    from selenium.common.exceptions import (
        NoSuchElementException,
        StaleElementReferenceException,
        TimeoutException,
    )
    from selenium.webdriver.support.ui import WebDriverWait

    passing = (NoSuchElementException, StaleElementReferenceException)
    try:
        out: T = WebDriverWait(d, timeout, poll_frequency=0.2, ignored_exceptions=passing).until(
            probe
        )
    except TimeoutException:
        status = d.find_elements("id", "status")
        said = status[0].text if status else "(no status line)"
        pytest.fail(
            f"{what}: not seen after {timeout:.0f} s at {d.current_url}; page said {said!r}"
        )
    return out


def screenshot(d: Any, path: Path) -> None:
    """The whole page into ``path`` (PNG): the window is grown to the page's height for it."""
    d.execute_script("window.scrollTo(0, 0);")  # a form filled in may have scrolled it
    height = int(d.execute_script("return document.documentElement.scrollHeight;"))
    d.set_window_size(WINDOW[0], max(WINDOW[1], min(height + 120, 4000)))
    try:
        assert d.save_screenshot(str(path)), path
    finally:
        d.set_window_size(*WINDOW)


def fetch_status(d: Any, path: str, method: str = "GET", csrf: str | None = None) -> int:
    """The status of ``fetch(path)`` from the page (its cookie, and the CSRF header if given)."""
    script = """
        const [path, method, csrf, done] = arguments;
        const headers = csrf ? {"X-CSRF-Token": csrf} : {};
        fetch(path, {method: method, headers: headers, credentials: "same-origin"})
            .then((r) => done(r.status), (e) => done(String(e)));
    """
    status = d.execute_async_script(script, path, method, csrf)
    assert isinstance(status, int), status
    return status
