"""Every caption of the Snakemake report renders without a docutils message (a message would show as a "Docutils
System Messages" block in the report page)."""

from __future__ import annotations

import io

import pytest
from docutils.core import publish_parts

from tests.conftest import REPO

CAPTIONS = sorted((REPO / "workflow/report").glob("*.rst"))


@pytest.mark.parametrize("caption", CAPTIONS, ids=[c.name for c in CAPTIONS])
def test_caption_renders_without_docutils_messages(caption):
    messages = io.StringIO()
    publish_parts(
        caption.read_text(), writer="html", settings_overrides={"warning_stream": messages, "report_level": 1}
    )
    assert messages.getvalue() == ""
