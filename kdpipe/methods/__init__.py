"""Distillation methods: one module per method family, registered in :mod:`kdpipe.methods.registry`.

What a method module provides: docs/adding-a-method.md.
"""
