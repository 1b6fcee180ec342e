"""Claim (b)'s measurements: how far the target's law under the speculative verify schedule is
from its law under plain decode, beside the floors users already accept (docs/numerics.md).

``table`` replays a run's matched arm and measures the per-token drift and the batch floor,
``floors`` the prefill and dtype floors, ``replay`` the model and law the replay runs on. The
decision on the table is ``spectest.stats.drift``'s; the word "numerics" elsewhere means the same
claim: ``tests.numerics`` (the mode that asks for it) and the toy model's ``numerics=`` knob
(simulated rounding noise, ``models.toy``).
"""
