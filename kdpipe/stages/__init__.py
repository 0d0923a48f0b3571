"""The workflow's stages that are more than one library call: each module's ``run(settings, **arguments)`` does one
job's work, ``settings`` being its config slice read into its typed settings. Every stage is declared once in
:mod:`kdpipe.stages.catalog`. Teacher-side stages import nothing of the student side, so a change there never
reruns a teacher job (docs/caching-and-reruns.md).
"""
