"""The HTML report in a real browser (headless Chromium): counts, sorting, filtering,
the failing case's diff table, no console errors, and a screenshot."""
import json
import time

import pytest

import verify

import browser


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    browser.need_browser()
    base = tmp_path_factory.mktemp("browser")
    verify.run(level="L0", ops=["apply_rms_prop", "apply_proximal_gradient_descent"],
               backends=["torch", "mutants"], reports=str(base), run_id="run")
    driver = browser.start()
    driver.get((base / "run" / "report.html").as_uri())
    doc = json.loads((base / "run" / "results.json").read_text())
    yield driver, doc, base / "run"
    driver.quit()


def _visible_rows(driver):
    return driver.execute_script(
        "return Array.from(document.querySelectorAll('#results tbody tr'))"
        ".filter(r => r.style.display !== 'none')"
        ".map(r => [r.dataset.verdict, r.cells[7].dataset.v]);")


def test_summary_counts_match_results_json(page):
    driver, doc, _ = page
    for verdict, n in doc["meta"]["counts"].items():
        assert driver.find_element("id", f"count-{verdict}").text == str(n)
    assert int(driver.find_element("id", "shown").text) == len(doc["rows"])


def test_sorting_by_a_metric(page):
    driver, _, _ = page
    header = driver.find_elements("css selector", "#results thead th")[7]  # MERE
    assert header.text.startswith("MERE")
    header.click()
    values = [float(v) for _, v in _visible_rows(driver) if v]
    assert values == sorted(values)
    header.click()
    values = [float(v) for _, v in _visible_rows(driver) if v]
    assert values == sorted(values, reverse=True)


def test_filtering_by_verdict_and_text(page):
    driver, doc, _ = page
    from selenium.webdriver.support.ui import Select
    Select(driver.find_element("id", "verdict-filter")).select_by_value("FAIL")
    rows = _visible_rows(driver)
    assert rows and {v for v, _ in rows} == {"FAIL"}
    assert len(rows) == doc["meta"]["counts"]["FAIL"]
    box = driver.find_element("id", "filter")
    box.send_keys("l2_shrink_missing")
    rows = _visible_rows(driver)
    n = sum(1 for r in doc["rows"] if r["verdict"] == "FAIL" and r["kernel"] == "l2_shrink_missing")
    assert len(rows) == n > 0
    box.clear()
    box.send_keys(" ")  # fire input
    Select(driver.find_element("id", "verdict-filter")).select_by_value("")


def test_a_failing_case_has_its_diff_table(page):
    driver, _, _ = page
    detail = driver.find_element("css selector", ".detail[data-verdict='FAIL']")
    table = detail.find_element("css selector", "table.difftable")
    assert len(table.find_elements("css selector", "tbody tr")) == 10
    heads = [th.text for th in table.find_elements("css selector", "thead th")]
    assert heads[0] == "index" and heads[-4:] == ["golden", "actual", "abs diff", "rel diff"]
    img = detail.find_element("css selector", "img.plot")
    assert driver.execute_script("return arguments[0].naturalWidth", img) > 300


def test_renders_without_console_errors_and_screenshots(page):
    driver, _, run_dir = page
    driver.get((run_dir / "report.html").as_uri())
    time.sleep(0.3)
    severe = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    assert severe == []
    shot = run_dir / "report.png"
    driver.save_screenshot(str(shot))
    assert shot.stat().st_size > 20_000
