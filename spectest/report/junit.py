"""JUnit XML of a stored run for CI: the XML layout, every text escaped (``xml_text``). Reads
``summary.json`` only; computes no statistic.

The why and the details: docs/internals.md "spectest/report/junit.py".
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import Any

from spectest.decision.summary import verdict_lines
from spectest.report.escape import xml_attr, xml_text


def _scrub(root: ET.Element) -> None:
    """Every text, tail and attribute of the tree made valid XML 1.0 (``xml_text``)."""
    for el in root.iter():
        if el.text is not None:
            el.text = xml_text(el.text)
        if el.tail is not None:
            el.tail = xml_text(el.tail)
        for key, value in el.attrib.items():
            el.attrib[key] = xml_attr(value)


def render_junit(summary: dict[str, Any], prompt_set: str = "prompts") -> str:
    """JUnit XML text. A config's case fails when the candidate has rejections in that config;
    a tooth's case fails when the tooth is unsound; the ``scope`` case states what was tested
    and the resolution (properties, system-out) and fails when the run is inconclusive for a
    reason no tooth case shows."""
    name = str(summary.get("name", "spectest"))
    suite = ET.Element("testsuite", name=f"spectest.{name}")
    cand = next((c for c in summary.get("comparisons", []) if c["role"] == "candidate"), None)
    outcomes = [] if cand is None else _config_cases(suite, name, prompt_set, cand)
    outcomes += _teeth_cases(suite, name, summary.get("teeth", []))
    outcomes.append(_scope_case(suite, name, summary))
    suite.set("tests", str(len(outcomes)))
    suite.set("failures", str(sum(outcomes)))
    suite.set("errors", "0")
    _scrub(suite)
    ET.indent(suite)
    return (
        '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(suite, encoding="unicode") + "\n"
    )


def _config_cases(
    suite: ET.Element, name: str, prompt_set: str, cand: dict[str, Any]
) -> list[bool]:
    """One case per config of the candidate; failed or not, in order."""
    failed = []
    for cs in cand["by_config"]:
        tc = ET.SubElement(
            suite, "testcase", classname=f"spectest.{name}.{prompt_set}", name=str(cs["config_id"])
        )
        failed.append(bool(cs["rejections"]))
        if cs["rejections"]:
            cid = cs["config_id"]
            cells = [f for f in cand["failing"] if f"/{cid}" in f or f"{cid}@" in f]
            msg = f"{cs['rejections']} rejection(s) after correction in config {cid}"
            fe = ET.SubElement(tc, "failure", message=msg, type="distributions differ")
            fe.text = "\n".join(cells or cand["failing"])
    return failed


def _teeth_cases(suite: ET.Element, name: str, teeth: list[dict[str, Any]]) -> list[bool]:
    """One case per tooth, with its verdict ("killed (size 0.167)") and size as properties."""
    failed = []
    for t in teeth:
        tc = ET.SubElement(suite, "testcase", classname=f"spectest.{name}.teeth", name=t["arm"])
        tp = ET.SubElement(tc, "properties")
        ET.SubElement(tp, "property", name="verdict", value=str(t["label"]))
        if t.get("size_tv") is not None:
            ET.SubElement(tp, "property", name="size_tv", value=str(t["size_tv"]))
        if t.get("null"):  # a plain null: what it compared (docs/protocols.md "The null tooth")
            ET.SubElement(tp, "property", name="null", value=str(t["null"]))
        failed.append(not t["sound"])
        if not t["sound"]:
            ET.SubElement(
                tc, "failure", message=f"tooth {t['arm']}: {t['label']}", type="unsound harness"
            )
    return failed


def _scope_case(suite: ET.Element, name: str, summary: dict[str, Any]) -> bool:
    """The verdict's scope: one case that carries what was tested and the resolution (and each
    family's own line), and fails with the headline whenever the run is inconclusive for a
    reason no other case shows (nothing testable, resolution worse than required, no teeth
    where asked)."""
    v = summary["verdict"]
    scope = v.get("scope") or {}
    tc = ET.SubElement(suite, "testcase", classname=f"spectest.{name}", name="scope")
    props = ET.SubElement(tc, "properties")
    for key in ("tested", "resolution"):
        if scope.get(key):
            ET.SubElement(props, "property", name=key, value=str(scope[key]))
    for i, line in enumerate(scope.get("claims", ())):  # matched numerics mode
        ET.SubElement(props, "property", name=f"claim_{'ab'[i] if i < 2 else i}", value=str(line))
    for fam in scope.get("families", ()):  # a family's line of its own
        if fam.get("verdict_line"):
            ET.SubElement(props, "property", name=fam["name"], value=str(fam["verdict_line"]))
    for key in ("cells_tested", "cells_untestable", "mde_tv", "required_mde_tv"):
        if scope.get(key) is not None:
            ET.SubElement(props, "property", name=key, value=str(scope[key]))
    claim = scope.get("power_claim") or {}
    if claim.get("tv") is not None:  # the power claim checked against required_mde_tv
        ET.SubElement(props, "property", name="power_claim_tv", value=str(claim["tv"]))
    failed = v["decision"] == "inconclusive" and all(t["sound"] for t in summary.get("teeth", []))
    if failed:
        fe = ET.SubElement(
            tc, "failure", message=str(v.get("headline") or v["decision"]), type="inconclusive"
        )
        fe.text = "\n".join(v["reasons"])
    out = ET.SubElement(tc, "system-out")
    out.text = "\n".join(verdict_lines(v))
    return failed
