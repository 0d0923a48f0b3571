"""Every caption of the Snakemake report renders without a docutils message (a message would show as a "Docutils
System Messages" block in the report page). Captions are Jinja templates first, as Snakemake renders them."""

from __future__ import annotations

import io
from pathlib import Path
from types import SimpleNamespace

import jinja2
import pytest
from docutils.core import publish_parts

from tests.conftest import REPO

CAPTIONS = sorted((REPO / "workflow/report").glob("*.rst"))


def render(caption: Path, files=()) -> str:
    """The caption's HTML, as `snakemake --report` makes it; fails on any docutils message."""
    text = jinja2.Environment().from_string(caption.read_text())
    rst = text.render(snakemake=SimpleNamespace(config={}), categories={}, files=list(files))
    messages = io.StringIO()
    html = publish_parts(rst, writer="html", settings_overrides={"warning_stream": messages, "report_level": 1})
    assert messages.getvalue() == ""
    return html["html_body"]


@pytest.mark.parametrize("caption", CAPTIONS, ids=[c.name for c in CAPTIONS])
def test_caption_renders_without_docutils_messages(caption):
    render(caption)


def test_the_landing_page_includes_the_comparison(tmp_path):
    (tmp_path / "landing.html").write_text('<table class="kdpipe-test"><tr><td>vkd</td></tr></table>')
    summary = SimpleNamespace(path=tmp_path / "summary.html", target="summary.html")
    other = SimpleNamespace(path=tmp_path / "metrics.png", target="metrics.png")
    page = render(REPO / "workflow/report/workflow.rst", [other, summary])
    assert '<table class="kdpipe-test">' in page and "No comparison yet" not in page
    assert "No comparison yet" in render(REPO / "workflow/report/workflow.rst", [other])
