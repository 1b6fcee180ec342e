"""Setting up the real engines spectest drives in environments of their own
(``spectest setup ENGINE``): one module per engine (``openvino``, ``mistralrs``) and the shared
pinned-venv machinery (``venv``). Nothing here is ever installed into spectest's own
environment."""
