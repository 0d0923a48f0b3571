"""Generate the tables of docs/design.md from the code: the stages (kdpipe.stages.catalog.STAGES and the rules that
run them), the signal catalog (kdpipe.signals.catalog.SIGNALS) and the layers (every module of kdpipe/ by the first
sentence of its docstring).

    python docs/make_design.py            # (re)write the tables in docs/design.md
    python docs/make_design.py --check    # exit 1, with a diff, if a table is stale

Each table sits between ``<!-- generated: NAME -->`` and ``<!-- end generated -->``; the text around them is
written by hand. tests/test_docs.py runs the check, so a new stage, signal or module shows up here.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from kdpipe.signals.catalog import SIGNALS  # noqa: E402
from kdpipe.stages.catalog import STAGES  # noqa: E402

DOC = REPO / "docs" / "design.md"
REGENERATE = "python docs/make_design.py"
BLOCK = re.compile(r"(<!-- generated: (\w+) -->\n)(.*?)(<!-- end generated -->)", re.S)


def rules_by_command() -> dict[str, str]:
    """``{sub-command: its rules}`` read from the rule files' ``stage("<command>", ...)`` declarations: the rule is
    named after the stage, or (``rule_name=`` in a loop) one per signal pass or per signal."""
    found: dict[str, str] = {}
    for path in sorted((REPO / "workflow" / "rules").glob("*.smk")):
        for match in re.finditer(r'^( *)stage\(\n\s*"([a-z-]+)",(.*?)^\1\)', path.read_text(), re.S | re.M):
            indent, command, body = match.groups()
            named = re.search(r"rule_name=(\w+)", body)
            if named is None:
                found[command] = f"`{STAGES[command].rule}`"
            elif named.group(1) == "pass_rule":
                found[command] = "one per pass, named after its signals"
            else:
                found[command] = "one per signal, named after it"
    return found


def _code(names) -> str:
    return ", ".join(f"`{name}`" for name in names)


def stages_table() -> str:
    rules = rules_by_command()
    lines = [
        "| `python -m kdpipe …` | rule | function | what it does | runs a model | trains |",
        "| --- | --- | --- | --- | :---: | :---: |",
    ]
    for name, stage in STAGES.items():
        rule = rules.get(name, "— (a command for users)")
        lines.append(
            f"| `{name}` | {rule} | `{stage.entry}` | {stage.summary} | {'yes' if stage.model else ''} | "
            f"{'yes' if stage.trains else ''} |"
        )
    return "\n".join(lines) + "\n"


def signals_table() -> str:
    lines = [
        "| signal | files in `results/signals/{teacher}/{split}/` | pass module | section | contents |",
        "| --- | --- | --- | --- | --- |",
    ]
    for signal in SIGNALS.values():
        lines.append(
            f"| `{signal.name}` | {_code(signal.files)} | `{signal.module}` | `{signal.shards}` | {signal.summary} |"
        )
    return "\n".join(lines) + "\n"


def first_sentence(path: Path) -> str:
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    paragraph = " ".join(doc.split("\n\n")[0].split())
    sentence = re.split(r"(?<=[a-z)\]`'\"])\.(?:\s|$)", paragraph, maxsplit=1)[0].rstrip(".:,")
    sentence = re.sub(r":(?:class|mod|func|meth|data):`~?([^`]+)`", r"`\1`", sentence).replace("``", "`")
    return sentence.replace("|", "\\|")


def layers_table() -> str:
    lines = ["| package | module | what it is (the first sentence of its docstring) |", "| --- | --- | --- |"]
    root = REPO / "kdpipe"
    for init in sorted(root.rglob("__init__.py")):
        package = ".".join(init.parent.relative_to(root.parent).parts)
        modules = [init] + sorted(p for p in init.parent.glob("*.py") if p.name != "__init__.py")
        for i, module in enumerate(modules):
            name = "(package)" if module.name == "__init__.py" else f"`{module.stem}`"
            lines.append(f"| {f'`{package}`' if i == 0 else ''} | {name} | {first_sentence(module)} |")
    return "\n".join(lines) + "\n"


TABLES = {"stages": stages_table, "signals": signals_table, "layers": layers_table}


def generate(text: str) -> str:
    def fill(match: re.Match) -> str:
        name = match.group(2)
        if name not in TABLES:
            raise SystemExit(f"docs/design.md: unknown generated table {name!r}; known: {', '.join(TABLES)}")
        return match.group(1) + TABLES[name]() + match.group(4)

    return BLOCK.sub(fill, text)


def check(doc: Path = DOC) -> str | None:
    """None when the tables of ``doc`` are up to date, else the diff and the command that regenerates them."""
    text = doc.read_text()
    fresh = generate(text)
    if fresh == text:
        return None
    diff = "".join(difflib.unified_diff(text.splitlines(True), fresh.splitlines(True), str(doc), "generated"))
    return f"{doc} has stale generated tables; run `{REGENERATE}`:\n{diff}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 with a diff if a table is stale")
    args = parser.parse_args()
    if args.check:
        problem = check()
        if problem:
            print(problem, file=sys.stderr)
            return 1
        return 0
    DOC.write_text(generate(DOC.read_text()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
