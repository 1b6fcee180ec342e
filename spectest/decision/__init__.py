"""The decision, in one place: how a run's tables become its verdict, headline, claims, scope
and exit code. In the order a decision is made:

- ``judge``: every arm against its reference (``compare_all``), judged (``judge``), the final
  files written (``finish_run``: run, teeth, compare and analyze all go through it);
- ``comparison``: one arm's analysis as the verdict sees it (``compare_arm`` → ``Comparison``;
  a tooth's judgement is its comparison's);
- ``claims``: claim (a)'s power claim and requirement, claim (b)'s inputs and decision;
- ``ladder``: the decision rules, one rung each, and the exit codes;
- ``verdict``: ``decide`` → ``Verdict`` (headline, reasons, ``Scope``);
- ``summary``: ``summary.json`` and the verdict's printed lines.

The map: docs/architecture.md "The decision (stats.battery + decision/)"; the rules:
docs/verdict.md.
"""
