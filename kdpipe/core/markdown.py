"""Names from the data or the config as Markdown text (docs/report.md, "Category *Summary*"): one escaping for the
report's Markdown files (kdpipe.report.markdown, kdpipe.report.ood, kdpipe.report.routing) and a trained model's card
(kdpipe.models.card). Kept out of kdpipe.report, whose modules are in no teacher's code: the card is written by
every training job, so what it imports is part of every model's code fingerprint."""

from __future__ import annotations

import html
import re

# The ASCII characters of Markdown inline syntax outside code spans (GFM and math included); an underscore between
# two letters or digits is no emphasis (CommonMark's flanking rules), so ``max_prob`` stays so
MARKDOWN_ACTIVE = re.compile(r"([\\`*\[\]|~$#]|(?<![^\W_])_|_(?![^\W_]))")


def plain(value) -> str:
    """``value`` as Markdown text that shows it as it is, outside code spans: Markdown syntax (:data:`MARKDOWN_ACTIVE`,
    ``|`` included) backslash-escaped, ``<``, ``>`` and ``&`` as HTML entities (raw HTML is HTML in Markdown), a line
    break as a space (it would end a table row). Entities for ``<``: a backslash does not escape it in every viewer."""
    escaped = html.escape(MARKDOWN_ACTIVE.sub(r"\\\1", str(value)), quote=False)
    return escaped.replace("\r\n", " ").replace("\n", " ").replace("\r", " ")
