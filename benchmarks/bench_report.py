"""The HTML report at 2,000 case rows: build time, file size, load time in headless
Chromium (navigation start to the load event) and the time of one sort click."""
from __future__ import annotations

import copy
import sys
import tempfile
import time
from pathlib import Path

import verify
from verify.report import results
from verify.report import html

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import browser  # noqa: E402  (the tests' headless Chromium helper)

ROWS = 2000


def main() -> None:
    with tempfile.TemporaryDirectory() as d:
        base = Path(d)
        res = verify.run(level="L0", ops=["apply_rms_prop", "lion", "apply_adam_w_v2"],
                         backends=["torch", "mutants"], reports=False)
        rows = []
        while len(rows) < ROWS:
            for r in res.rows:
                r2 = copy.deepcopy(r)
                r2["case_id"] = f"{r['case_id']}-{len(rows)}"
                rows.append(r2)
        rows = rows[:ROWS]
        meta = {"run_id": "bench", "level": "L0", "environment": results.environment()}
        t0 = time.perf_counter()
        path = html.write(rows, meta, base)
        build = time.perf_counter() - t0
        size = path.stat().st_size
        print(f"report of {ROWS} rows ({sum(r['verdict'] == 'FAIL' for r in rows)} failing): "
              f"built in {build:.2f} s, {size / 1e6:.2f} MB (limit 20 MB)")
        if not browser.available():
            print("  chromium / chromedriver not installed: no browser timings")
            return
        driver = browser.start()
        try:
            loads = []
            for _ in range(3):
                driver.get(path.as_uri())
                loads.append(driver.execute_script(
                    "var t = performance.timing; return t.loadEventEnd - t.navigationStart;"))
            sort_ms = driver.execute_script("""
                var th = document.querySelectorAll('#results thead th')[8];
                var t0 = performance.now(); th.click(); return performance.now() - t0;""")
            print(f"  Chromium load (navigation start to load event), 3 tries: "
                  f"{', '.join(f'{ms / 1000:.2f} s' for ms in loads)} (target < 3 s)")
            print(f"  sort 2,000 rows by MARE: {sort_ms:.0f} ms")
        finally:
            driver.quit()


if __name__ == "__main__":
    main()
