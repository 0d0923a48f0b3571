"""The routes of the knowledge-integration students: one cached ``route`` job per set of teachers and router
settings, shared by every student that routes the same way (docs/routing.md)."""

from __future__ import annotations

from kdpipe.methods.registry import get_method
from kdpipe.plan.entries import without
from kdpipe.plan.paths import ROUTE, SIGNALS
from kdpipe.routing import DISPLAY_SETTINGS, RouteSpec, route_spec
from kdpipe.routing.artifact import FILES, TRANSFER_FILES
from kdpipe.signals.catalog import signal_files


class Routes:
    """Mixed into :class:`kdpipe.plan.Plan`."""

    def student_route(self, student: str) -> str | None:
        """The route a student's method reads (None for a method that does not weigh its teachers per row)."""
        spec = self.route_spec(student)
        return None if spec is None else spec.name(self.student_teachers(student))

    def route_spec(self, student: str) -> RouteSpec | None:
        """What a student's routing depends on (None for a method that does not weigh its teachers per row)."""
        config = self.students[student].config
        if not get_method(config["method"]).routed:
            return None
        args = config["method_args"]
        return route_spec(args["router"], args["score"], args["temperature"], args["calibrate"])

    def routes(self) -> dict[str, dict]:
        """Every route of the experiment: name -> {"teachers": [...], **its spec}."""
        out = {}
        for student in self.students:
            name = self.student_route(student)
            if name and name not in out:
                out[name] = {"teachers": self.student_teachers(student), **self.route_spec(student).to_dict()}
        return out

    def _route(self, route: str) -> RouteSpec:
        """The :class:`~kdpipe.routing.RouteSpec` of a route of :meth:`routes`."""
        return RouteSpec.from_params(without(self.routes()[route], "teachers"), f"route {route}")

    def route_params(self, route: str) -> dict:
        """The route job's config slice: its teachers and router settings, the signals it reads per split, and the
        ``routing`` settings but the display ones (``warn_below``: the report's, :meth:`report_params`), so changing
        those reruns the report only."""
        return {
            **self.routes()[route],
            "signals": self.route_signals(route),
            "routing": without(self.config["routing"], *DISPLAY_SETTINGS),
        }

    def route_signals(self, route: str) -> dict[str, list[str]]:
        """The signals a route reads from each of its teachers, per split (:meth:`kdpipe.routing.RouteSpec.signals`)."""
        return self._route(route).signals(self.mc_splits())

    def route_inputs(self, route: str) -> list[str]:
        """The cached signal files of :meth:`route_signals` of every teacher, the rule's inputs."""
        return self._signal_paths(route, self.route_signals(route))

    def _signal_paths(self, route: str, signals: dict[str, list[str]]) -> list[str]:
        """The files of ``signals`` (split -> signal names) of every teacher of ``route``."""
        return [
            path
            for teacher in self.routes()[route]["teachers"]
            for split, names in signals.items()
            for name in names
            for path in signal_files(name, SIGNALS.format(teacher=teacher, split=split))
        ]

    def report_params(self) -> dict:
        """The report job's slice (:class:`kdpipe.report.settings.ReportSettings`): ``routing.warn_below`` when some
        student reads a route, ``transfer_curve`` when some student learns from transfer rows, and the margin of the
        flag of an int8 model when one is evaluated."""
        out = {}
        if self.routes():
            out = {key: self.config["routing"][key] for key in DISPLAY_SETTINGS if key in self.config["routing"]}
        if self.has_transfer_students():  # the rule declares transfer.png: the report must write it
            out["transfer_curve"] = True
        if any(model.endswith(".int8") for model in self.evaluated_exports()):  # its flag of an int8 model
            out["max_accuracy_drop"] = self.config["export"]["max_accuracy_drop"]
        return out

    def route_files(self, student: str) -> list[str]:
        """The route artifact files a student reads (none when it reads no route): its train rows' scores, and its
        transfer rows' when it learns from them (the ``route_transfer`` job)."""
        route = self.student_route(student)
        if route is None:
            return []
        names = [FILES[-1], FILES[0], *(TRANSFER_FILES[::-1] if self.student_transfer(student) else [])]
        return [f"{ROUTE.format(route=route)}/{name}" for name in names]

    def transfer_routes(self) -> list[str]:
        """The routes that score transfer rows: those of a student that learns from them."""
        return sorted(
            {self.student_route(s) for s in self.students if self.student_route(s) and self.student_transfer(s)}
        )

    def route_transfer_params(self, route: str) -> dict:
        """The ``route_transfer`` job's slice: its route's, with the signals it reads itself."""
        return {**self.route_params(route), "signals": self._route(route).transfer_signals()}

    def route_transfer_inputs(self, route: str) -> list[str]:
        """The cached signal files the ``route_transfer`` job of a route reads, declared as its inputs."""
        return self._signal_paths(route, self._route(route).transfer_signals())

    def route_dir(self, student: str) -> list[str]:
        """The folder of the route ``student`` reads, in a list: empty for a student that reads none."""
        route = self.student_route(student)
        return [] if route is None else [ROUTE.format(route=route)]
