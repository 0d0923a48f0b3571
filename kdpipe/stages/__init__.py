"""The workflow's stages that are more than one library call: each module's ``run(settings, **arguments)`` does one
job's work, ``settings`` being its config slice read into its typed settings. Every stage, these and the ones whose
work is a library function, is declared once in :mod:`kdpipe.stages.catalog`, from which the command line
(:mod:`kdpipe.cli`) and the rules are made.

Teacher-side stages (prepare, transfer, finetune_teacher, import_teacher, prototypes, the signal passes, route)
import nothing of the student side (methods, student architectures, distill): a change there never reruns a
teacher job (docs/caching-and-reruns.md).
"""
