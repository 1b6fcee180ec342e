"""Shipped acceptor adapters: real verification kernels in the acceptor contract, selected as
``candidate: acceptor:spectest.acceptors.NAME:FUNCTION``; each imports its package lazily.

The why and the details: docs/internals.md "spectest/acceptors/__init__.py".
"""
