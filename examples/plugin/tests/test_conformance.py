"""The plug-in's own tests: spectest's conformance check, from the plug-in author's pytest.

Run with ``python -m pytest tests`` from examples/plugin/ once the package is installed
(``pip install -e .``) next to spectest. The toy pair keeps it to a few seconds on a CPU.
"""

from __future__ import annotations

import pytest
from spectest_example_engine import ExampleEngine

from spectest import conformance
from spectest.engines.base import DrafterSpec
from spectest.engines.registry import engine_class

TOY = {"target": "toy:V=16,order=2,scale=2.0,seed=3", "draft": "toy:V=16,order=2,scale=1.0,seed=4"}


def test_the_entry_point_names_this_engine() -> None:
    assert engine_class("example-spec") is ExampleEngine


@pytest.mark.parametrize("options", [{}, {"stop_token": 5}])
def test_conforms(options: dict) -> None:
    report = conformance.check("example-spec", options, **TOY)
    report.assert_ok()  # on failure: every check's line, the failing ones first named FAIL


def test_a_one_hot_drafter_conforms_too() -> None:
    work = conformance.Workload(drafter=DrafterSpec(onehot=True, k=2))
    conformance.check(ExampleEngine, workload=work, **TOY).assert_ok()
