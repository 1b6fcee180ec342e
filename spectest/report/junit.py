"""JUnit XML of a stored run, for CI systems: one test case per config × prompt set (failures list
the failing cells) and one per tooth.

Owns: the XML layout. Reads ``summary.json`` only; computes no statistic.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import Any


def render_junit(summary: dict[str, Any], prompt_set: str = "prompts") -> str:
    """JUnit XML text. A config's case fails when the candidate has rejections in that config;
    a tooth's case fails when the tooth is unsound; an inconclusive run adds one failing case."""
    name = str(summary.get("name", "spectest"))
    suite = ET.Element("testsuite", name=f"spectest.{name}")
    cases = 0
    failures = 0
    cand = next((c for c in summary.get("comparisons", []) if c["role"] == "candidate"), None)
    if cand is not None:
        for cs in cand["by_config"]:
            cases += 1
            tc = ET.SubElement(
                suite,
                "testcase",
                classname=f"spectest.{name}.{prompt_set}",
                name=str(cs["config_id"]),
            )
            if cs["rejections"]:
                failures += 1
                cells = [
                    f
                    for f in cand["failing"]
                    if f"/{cs['config_id']}" in f or f"{cs['config_id']}@" in f
                ]
                msg = (
                    f"{cs['rejections']} rejection(s) after correction in config {cs['config_id']}"
                )
                fe = ET.SubElement(tc, "failure", message=msg, type="distributions differ")
                fe.text = "\n".join(cells or cand["failing"])
    for t in summary.get("teeth", []):
        cases += 1
        tc = ET.SubElement(suite, "testcase", classname=f"spectest.{name}.teeth", name=t["arm"])
        if not t["sound"]:
            failures += 1
            ET.SubElement(
                tc, "failure", message=f"tooth {t['arm']}: {t['label']}", type="unsound harness"
            )
    v = summary["verdict"]
    if v["decision"] == "inconclusive" and not any(
        not t["sound"] for t in summary.get("teeth", [])
    ):
        cases += 1
        failures += 1
        tc = ET.SubElement(suite, "testcase", classname=f"spectest.{name}", name="power")
        ET.SubElement(tc, "failure", message="; ".join(v["reasons"]), type="inconclusive")
    suite.set("tests", str(cases))
    suite.set("failures", str(failures))
    suite.set("errors", "0")
    ET.indent(suite)
    return (
        '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(suite, encoding="unicode") + "\n"
    )
