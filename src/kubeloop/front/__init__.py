"""The serving front: what runs inside a router Pod (and the local
platform's router process), between callers and Triton.

It imports nothing of the control plane (operator, pipelines, components,
the serving backends, the registry), so the router image carries only what
requirements/front.txt lists and starts fast; the import-linter contracts in
pyproject.toml and tests/unit/test_front_imports.py hold it to that."""
