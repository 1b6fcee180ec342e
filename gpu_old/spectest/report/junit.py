"""JUnit XML of a stored run, for CI systems: one test case per config × prompt set (failures list
the failing cells), one per tooth, and one ``scope`` case with the verdict's claim.

Owns: the XML layout. Reads ``summary.json`` only; computes no statistic. The file is valid
XML 1.0 whatever the ids hold: every text and attribute passes ``report.escape.xml_text``
(ElementTree escapes markup characters but writes a control character raw).
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import Any

from spectest.report.escape import xml_text
from spectest.summary import verdict_lines


def _scrub(root: ET.Element) -> None:
    """Every text, tail and attribute of the tree made valid XML 1.0 (``xml_text``)."""
    for el in root.iter():
        if el.text is not None:
            el.text = xml_text(el.text)
        if el.tail is not None:
            el.tail = xml_text(el.tail)
        for key, value in el.attrib.items():
            el.attrib[key] = xml_text(value)


def render_junit(summary: dict[str, Any], prompt_set: str = "prompts") -> str:
    """JUnit XML text. A config's case fails when the candidate has rejections in that config;
    a tooth's case fails when the tooth is unsound; the ``scope`` case states what was tested
    and the resolution (properties, system-out) and fails when the run is inconclusive for a
    reason no tooth case shows."""
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
        tp = ET.SubElement(tc, "properties")  # the verdict ("killed (size 0.167)") and the size
        ET.SubElement(tp, "property", name="verdict", value=str(t["label"]))
        if t.get("size_tv") is not None:
            ET.SubElement(tp, "property", name="size_tv", value=str(t["size_tv"]))
        if not t["sound"]:
            failures += 1
            ET.SubElement(
                tc, "failure", message=f"tooth {t['arm']}: {t['label']}", type="unsound harness"
            )
    v = summary["verdict"]
    # the verdict's scope: one case that carries what was tested and the resolution, and fails
    # with the headline whenever the run is inconclusive for a reason no other case shows
    # (nothing testable, resolution worse than required, no teeth where asked)
    scope = v.get("scope") or {}
    cases += 1
    tc = ET.SubElement(suite, "testcase", classname=f"spectest.{name}", name="scope")
    props = ET.SubElement(tc, "properties")
    for key in ("tested", "resolution"):
        if scope.get(key):
            ET.SubElement(props, "property", name=key, value=str(scope[key]))
    for key in ("cells_tested", "cells_untestable", "mde_tv", "required_mde_tv"):
        if scope.get(key) is not None:
            ET.SubElement(props, "property", name=key, value=str(scope[key]))
    claim = scope.get("power_claim") or {}
    if claim.get("tv") is not None:  # the power claim checked against required_mde_tv
        ET.SubElement(props, "property", name="power_claim_tv", value=str(claim["tv"]))
    if v["decision"] == "inconclusive" and not any(
        not t["sound"] for t in summary.get("teeth", [])
    ):
        failures += 1
        fe = ET.SubElement(
            tc, "failure", message=str(v.get("headline") or v["decision"]), type="inconclusive"
        )
        fe.text = "\n".join(v["reasons"])
    out = ET.SubElement(tc, "system-out")
    out.text = "\n".join(verdict_lines(v))
    suite.set("tests", str(cases))
    suite.set("failures", str(failures))
    suite.set("errors", "0")
    _scrub(suite)
    ET.indent(suite)
    return (
        '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(suite, encoding="unicode") + "\n"
    )
