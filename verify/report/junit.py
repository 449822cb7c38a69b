"""JUnit XML: each case x backend x output a test case; a failure carries the deciding
standard, metric and threshold. Mutants: a caught one passes, a missed one fails."""
from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

from verify.report.rows import counts, mutant_summary


def build(rows: list[dict]) -> ET.ElementTree:
    suites = ET.Element("testsuites", name="kernel-verify")
    by_op: dict[str, list[dict]] = {}
    for r in rows:
        by_op.setdefault(r["op"], []).append(r)
    for op, op_rows in sorted(by_op.items()):
        c = counts(op_rows)
        failing = sum(1 for r in op_rows if r["verdict"] == "FAIL" and r.get("expected") == "PASS")
        suite = ET.SubElement(suites, "testsuite", name=op, tests=str(len(op_rows)),
                              failures=str(failing), errors=str(c["ERROR"]),
                              skipped=str(c["SKIP"]))
        for r in op_rows:
            kernel = r["backend"] if r["kernel"] == r["op"] else f"{r['backend']}.{r['kernel']}"
            case = ET.SubElement(suite, "testcase", classname=f"{op}.{kernel}",
                                 name=f"{r['level']}-{r['case_id']}-{r.get('output', '-')}",
                                 time=f"{float(r.get('kernel_s') or 0):.6f}")
            message = f"{r.get('standard') or '-'}: {r.get('reason') or ''}"
            if r["verdict"] == "ERROR":
                ET.SubElement(case, "error", message=message).text = (r.get("reason") or "")
            elif r["verdict"] == "SKIP":
                ET.SubElement(case, "skipped", message=(r.get("reason") or ""))
            elif r["verdict"] == "FAIL" and r.get("expected") == "PASS":
                fail = ET.SubElement(case, "failure", message=message, type="precision")
                fail.text = (f"{message}\nMERE {r.get('mere')} MARE {r.get('mare')} max abs "
                             f"{r.get('max_abs')} (floor max abs {r.get('floor_max_abs')})")
    mutants = mutant_summary(rows)
    if mutants:
        suite = ET.SubElement(suites, "testsuite", name="mutants", tests=str(len(mutants)),
                              failures=str(sum(not m["caught"] for m in mutants)), errors="0",
                              skipped="0")
        for m in mutants:
            case = ET.SubElement(suite, "testcase", classname=f"mutants.{m['op']}",
                                 name=f"{m['kernel']} is caught")
            if not m["caught"]:
                ET.SubElement(case, "failure", message="the known-bad kernel passed every case",
                              type="missed-mutant")
    return ET.ElementTree(suites)


def write(rows: list[dict], path: str | Path) -> Path:
    tree = build(rows)
    ET.indent(tree)
    tree.write(path, encoding="utf-8", xml_declaration=True)
    return Path(path)
