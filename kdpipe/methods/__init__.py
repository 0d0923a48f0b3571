"""Distillation methods: one module per method family, registered in :mod:`kdpipe.methods.registry`.

A method module provides its losses as pure tensor functions and ``build(ctx, args) -> Objective``, whose ``args``
arrive complete and checked against the registry's declaration (names, types, choices) when the DAG is built; the
registry also declares which cached teacher signals it reads, so the workflow requests exactly those.
"""
