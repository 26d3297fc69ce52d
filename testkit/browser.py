"""A real headless browser for the admin tests: Debian's ``chromium`` and
``chromedriver`` (``.ci/install-browser`` installs them), started the way this machine's
closed network needs (no background connections, no first-run or sync)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")

#: Marks for a module of browser tests: slow, and skipped (saying why) without chromium.
BROWSER_MARKS = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not (CHROMIUM.exists() and CHROMEDRIVER.exists()),
        reason="needs Debian's chromium and chromium-driver: run .ci/install-browser",
    ),
]


@contextmanager
def chromium(profile: Path, *, width: int, height: int) -> Iterator[webdriver.Chrome]:
    """A headless Chromium window of ``width`` x ``height`` with a fresh profile in
    ``profile``; quit on exit."""
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        f"--window-size={width},{height}",
        f"--user-data-dir={profile}",
    ):
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options, service=Service(executable_path=str(CHROMEDRIVER)))
    driver.implicitly_wait(0)
    try:
        yield driver
    finally:
        driver.quit()
