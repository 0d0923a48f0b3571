"""Meta-KD (docs/methods.md §4), every part of it in one place.

Teacher side (imported by name by the teacher-side stages, and importing nothing of the student side):
``prototypes`` (prototype scores of the train rows), ``teacher`` (the meta-teacher objective), ``branch`` (its
domain branch), ``domain`` (the domain signal pass). Student side: ``student`` (the two-stage student's losses).
"""
