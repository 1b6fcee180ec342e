"""transformers as engines under test: ``hf-generate`` (plain ``generate(do_sample=True)``) and
``hf-assisted`` (assisted generation, transformers' speculative sampling).

One module per concern, nothing re-exported (docs/architecture.md's module table). Imports run
one way: pinning ← rounds, laws ← decode ← probe, engines. Works with transformers 4.44 and 5.x
(feature-detected, never compared by version number): docs/engines-hf.md.
"""
