"""Shipped acceptor adapters: real verification kernels in the acceptor contract
(``spectest.engines.acceptor``), selected as
``candidate: acceptor:spectest.acceptors.NAME:FUNCTION``.

Each adapter imports its package lazily (on the engine's start, ``spectest_prepare``), so
importing the adapter costs nothing and a missing package is one ``EngineError`` line (exit 2).
"""
