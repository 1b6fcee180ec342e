"""transformers as engines under test: ``hf-generate`` (plain ``generate(do_sample=True)``) and
``hf-assisted`` (assisted generation, transformers' speculative sampling).

One module per concern; nothing is re-exported here:

- ``pinning``: which transformers this is and what its ``generate`` does (feature detection,
  ``ScoresSupport``), and the settings that pin every field of the law down
  (``generation_config``, ``own_generation_config``, ``assistant_settings``, ``LogitScale``);
- ``rounds``: the per-round telemetry of assisted generation (``RoundRecorder``), read from the
  tensors transformers' own speculative sampler consumed;
- ``decode``: rows → tokens (``hf_plain_decode``, ``hf_assisted_decode``: ``ArmOutput`` s like
  the built-in loops), with white-box columns from transformers' ``output_scores``;
- ``teacher``: the laws along emitted sequences with transformers' own warpers
  (``hf_teacher_force``; the shared teacher of a run with an hf engine);
- ``probe``: which law transformers' assistant really uses as q (``probe_draft_law``,
  ``expected_acceptance``);
- ``engines``: ``HFGenerateEngine`` and ``HFAssistedEngine``, the two as engines of the contract.

Imports run one way: pinning ← rounds, teacher ← decode ← probe, engines. Works with
transformers 4.44 and 5.x (feature-detected, never compared by version number). How transformers
behaves and how each setting pins it down: docs/engines-hf.md.
"""
