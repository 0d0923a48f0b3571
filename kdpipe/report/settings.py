"""The typed settings of the ``report`` job (docs/design.md, "Style": settings read once), made by
:meth:`kdpipe.plan.routes.Routes.report_params`; torch-free."""

from __future__ import annotations

from dataclasses import dataclass

from kdpipe.core.settings import Settings, from_schema


@dataclass(frozen=True)
class ReportSettings(Settings):
    """The routing warning's threshold (``routing.warn_below``, in the slice when some student reads a route),
    whether to draw ``transfer.png`` (``transfer_curve``: some student learns from transfer rows) and the margin of
    the flag of an int8 model (``export.max_accuracy_drop``, in the slice when one is evaluated)."""

    warn_below: float = from_schema("routing", "warn_below")
    transfer_curve: bool = False
    max_accuracy_drop: float = from_schema("export", "max_accuracy_drop")
