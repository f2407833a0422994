"""Typed config: structured dataclasses (one docstring per field), YAML recipes, one validation pass.

Imports nothing else from this project, and nothing heavy: the CLI validates a config before torch, Ray or
vLLM is imported.
"""
