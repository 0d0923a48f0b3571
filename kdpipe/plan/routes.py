"""The routes of the knowledge-integration students: one cached ``route`` job per set of teachers and router
settings, shared by every student that routes the same way (docs/routing.md)."""

from __future__ import annotations

from kdpipe.methods.registry import get_method
from kdpipe.plan.paths import ROUTE, SIGNALS
from kdpipe.routing import needs_mc, route_name, route_spec
from kdpipe.routing.artifact import FILES
from kdpipe.signals.catalog import signal_files

ROUTE_SPLITS = ("train", "validation")


class Routes:
    """Mixed into :class:`kdpipe.plan.Plan`."""

    def student_route(self, student: str) -> str | None:
        """The route a student's method reads (None for a method that does not weigh its teachers per row)."""
        config = self.students[student].config
        if not get_method(config["method"]).routed:
            return None
        return route_name(self.student_teachers(student), route_spec(config["method_args"]))

    def routes(self) -> dict[str, dict]:
        """Every route of the experiment: name -> {"teachers": [...], **its spec}."""
        out = {}
        for student in self.students:
            name = self.student_route(student)
            if name and name not in out:
                spec = route_spec(self.students[student].config["method_args"])
                out[name] = {"teachers": self.student_teachers(student), **spec}
        return out

    def route_params(self, route: str) -> dict:
        """The route job's config slice: its teachers, router settings and the ``routing`` section."""
        return {**self.routes()[route], "routing": dict(self.config["routing"])}

    def route_inputs(self, route: str) -> list[str]:
        """The cached signals a route reads: every teacher's logits and pooled states on train and validation, and
        its MC-dropout signal where the router's score needs it or the config makes it anyway."""
        spec = self.routes()[route]
        signals = []
        for teacher in spec["teachers"]:
            for split in ROUTE_SPLITS:
                folder = SIGNALS.format(teacher=teacher, split=split)
                names = ["logits", "pooled"]
                if needs_mc(spec) or split in self.mc_splits():
                    names.append("mc")
                signals += [path for name in names for path in signal_files(name, folder)]
        return signals

    def route_files(self, student: str) -> list[str]:
        """The route artifact files a student reads (none when it reads no route)."""
        route = self.student_route(student)
        return [] if route is None else [f"{ROUTE.format(route=route)}/{name}" for name in (FILES[-1], FILES[0])]

    def route_dir(self, student: str) -> str:
        route = self.student_route(student)
        return "" if route is None else ROUTE.format(route=route)
