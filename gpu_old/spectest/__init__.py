"""spectest: prove or disprove that a speculative sampler has exactly the law of plain sampling.

The package is organised as one concern per module (see README.md, "Architecture"):
protocol -> engines (models + sampling) -> store -> stats -> verdict -> report, with a thin CLI.
"""

__version__ = "0.1.0"
