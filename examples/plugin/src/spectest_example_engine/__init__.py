"""spectest-example-engine: an engine plug-in for spectest (``examples/plugin/README.md``)."""

from spectest_example_engine.engine import ExampleEngine

__version__ = "0.1.0"
__all__ = ["ExampleEngine", "__version__"]
