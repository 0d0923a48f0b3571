"""The choices of Dynamic KD's ``method_args`` (docs/methods.md §2), declared once and importable without torch.
The registry checks a config against them; :mod:`kdpipe.methods.dynamic_kd` implements them."""

from __future__ import annotations

DISTANCES = ("mse", "kl")  # §2: the KD distance D_i, logit MSE or T²·KL
TEACHER_MODES = ("hard", "soft", "soft_instance")  # §2a: how the student's entropy picks the teacher
DIRECTIONS = ("uncertain_to_small", "uncertain_to_large")  # §2a: which teacher the uncertain examples go to
SELECTIONS = ("entropy", "margin", "confidence", "random")  # §2b: how the student scores the batch's examples
REVERSED = "-r"  # §2b: a selection with this suffix keeps the examples from the other end of its order
DATA_STRATEGIES = SELECTIONS + tuple(selection + REVERSED for selection in SELECTIONS)  # §2b: every ``strategy``
OBJECTIVE_STRATEGIES = ("uncertainty", "uncertainty-r", "none")  # §2c: how ĥ splits the logit and hidden terms
