"""Shipped acceptor adapters: real verification kernels in the acceptor contract, selected as
``candidate: acceptor:spectest.acceptors.NAME:FUNCTION``; each imports its package lazily. Why and
details: docs/internals.md.
"""
