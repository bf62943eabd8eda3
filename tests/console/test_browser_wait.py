"""``tests.console.browser.wait_until``: what a probe may meet while the console redraws.

Logic only (no browser): Selenium's wait polls any object, so the probes here stand for the
console's pages."""

from __future__ import annotations

import pytest
from selenium.common.exceptions import StaleElementReferenceException

from tests.console.browser import wait_until


class _Page:
    """A page whose section was redrawn ``redrawn`` times while a probe held its element."""

    def __init__(self, redrawn: int) -> None:
        self.redrawn = redrawn
        self.current_url = "http://console.test/jobs/j"

    def find_elements(self, by: str, value: str) -> list[object]:
        return []

    def read(self) -> str:
        if self.redrawn:
            self.redrawn -= 1
            raise StaleElementReferenceException("stale element reference: element is not attached")
        return "revoked: client-005"


def test_an_element_the_page_replaced_mid_probe_is_read_again_at_the_next_poll() -> None:
    page = _Page(redrawn=2)
    got = wait_until(page, "the revoked list", lambda d: "client-005" in d.read() and d.read())
    assert got == "revoked: client-005"
    assert page.redrawn == 0


def test_a_probe_that_never_passes_fails_naming_what_it_waited_for() -> None:
    page = _Page(redrawn=10**6)
    with pytest.raises(pytest.fail.Exception, match="the revoked list: not seen after 1 s"):
        wait_until(page, "the revoked list", lambda d: d.read(), timeout=1)
