"""Distillation methods: one module per method family, registered in :mod:`kdpipe.methods.registry`.

A method module provides its losses as pure tensor functions and ``build(ctx, args) -> Objective``; the
registry declares (without importing torch) which cached teacher signals it reads, so the workflow can request
exactly those and nothing else.
"""
