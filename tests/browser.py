"""Headless Chromium (Debian's chromium + chromium-driver) driven by selenium."""
import atexit
import os
import shutil
import tempfile

import pytest

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"


def available() -> bool:
    return os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)


def need_browser():
    """Skip without a browser on a developer machine; in CI a missing browser is a failure."""
    if not available():
        if os.environ.get("CI"):
            pytest.fail("CI must install chromium and chromium-driver (.ci/run does)")
        pytest.skip("chromium / chromedriver not installed")


def start(width=1400, height=1000):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    profile = tempfile.mkdtemp(prefix="verify-chromium-")
    atexit.register(shutil.rmtree, profile, ignore_errors=True)  # after quit() ended chromium
    for arg in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                "--disable-component-update", "--no-first-run", "--disable-dev-shm-usage",
                f"--user-data-dir={profile}", f"--window-size={width},{height}"):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
