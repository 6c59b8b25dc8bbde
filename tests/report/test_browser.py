"""The dashboard in a real browser: headless Chromium through chromedriver and selenium.

Needs the Debian packages `chromium` and `chromium-driver` (.ci/run installs them); skipped
when they are missing. The browser is kept off the network: the report must work offline.
"""

import shutil
import subprocess
from pathlib import Path

import pytest

from cutlass_tune.report._dashboard import write_dashboard

REPO = Path(__file__).resolve().parents[2]
STORE_URL = f"sqlite:///{REPO / 'results' / 'sweep-nvidia-h200.sqlite'}"
PROBLEMS = [f"{s}x{s}x{s}_bf16bf16bf16_tn" for s in (1024, 4096, 8192)]
CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--window-size=1400,2000")

pytestmark = pytest.mark.skipif(
    CHROMIUM is None or CHROMEDRIVER is None,
    reason="needs headless Chromium: apt-get install chromium chromium-driver")

# Each plot shown: its size, title, and how many marks (bars, points, lines, heatmap images) it drew.
VISIBLE_PLOTS = """
return Array.from(document.querySelectorAll('.js-plotly-plot'))
  .filter(el => el.offsetParent !== null)
  .map(el => ({
    id: el.id,
    width: el.getBoundingClientRect().width,
    svg: el.querySelectorAll('svg.main-svg').length,
    title: (el.querySelector('.gtitle') || {}).textContent || '',
    marks: el.querySelectorAll('g.trace g.point path[d], g.trace path.point, g.trace path.js-line, g.hm image').length,
  }));
"""


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    path = tmp_path_factory.mktemp("browser") / "report.html"
    write_dashboard(STORE_URL, path)
    return path


@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    browser = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER, log_output=subprocess.DEVNULL))
    yield browser
    browser.quit()


def open_report(driver, report):
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(report.as_uri())
    WebDriverWait(driver, 30).until(lambda d: d.execute_script(
        "return document.readyState === 'complete' && window.Plotly !== undefined"
        " && document.querySelectorAll('section.problem:not([hidden])').length === 1"))


def shown_section(driver):
    return driver.execute_script(
        "return Array.from(document.querySelectorAll('section.problem:not([hidden])')).map(s => s.id)")


def assert_drawn(plots, problem):
    assert [p["id"].split("-", 1)[-1] for p in plots] == [
        "summary", "ratio", "tile", "schedule", "raster", "history", "importance", "compile", "failures"]
    for p in plots:
        assert p["svg"] and p["marks"] > 0 and p["width"] > 300, p
        if not p["id"].startswith("summary"):
            assert p["title"].endswith(problem), p


def test_report_renders_offline_without_console_errors(driver, report):
    open_report(driver, report)
    assert shown_section(driver) == ["p0"]
    assert_drawn(driver.execute_script(VISIBLE_PLOTS), PROBLEMS[0])
    fetched = driver.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
    assert not [url for url in fetched if not url.startswith(("file:", "data:", "blob:"))]
    errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors


def test_the_selector_switches_the_problem_drawn(driver, report):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    open_report(driver, report)
    select = Select(driver.find_element(By.ID, "problem-select"))
    assert [o.text for o in select.options] == PROBLEMS
    before = driver.execute_script(VISIBLE_PLOTS)
    for index in (2, 1, 0):
        select.select_by_index(index)
        assert shown_section(driver) == [f"p{index}"]
        plots = driver.execute_script(VISIBLE_PLOTS)
        assert_drawn(plots, PROBLEMS[index])
        if index != 0:
            assert [p["title"] for p in plots[1:]] != [p["title"] for p in before[1:]]
    assert [e for e in driver.get_log("browser") if e["level"] == "SEVERE"] == []
