"""The decision, in one place: how a run's tables become its verdict, headline, claims, scope
and exit code. Its modules in the order a decision is made: ``judge`` → ``comparison`` →
``claims`` → ``ladder`` → ``verdict`` → ``summary`` (``header``: what a summary is about;
``where``: which process computes the comparisons).
The map: docs/architecture.md "The decision (stats.battery + decision/)".
"""
