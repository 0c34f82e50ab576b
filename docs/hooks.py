"""MkDocs hooks (mkdocs.yml: hooks): tables generated from the code at build time.

A page holds a marker comment, and the hook replaces it with the table the code renders, so the
tables cannot drift from the code: ``<!-- gputrain:training_args_fields -->`` becomes
``gputrain.training_args.fields_markdown()`` and ``<!-- gputrain:trainer_keywords -->`` becomes
``gputrain.trainer.trainer_keywords_markdown()``. The installed gputrain is imported
(``pip install ".[docs]"`` installs it).
"""

from __future__ import annotations

import importlib

_MARKERS = {
    "<!-- gputrain:training_args_fields -->": ("gputrain.training_args", "fields_markdown"),
    "<!-- gputrain:trainer_keywords -->": ("gputrain.trainer", "trainer_keywords_markdown"),
}


def on_page_markdown(markdown: str, page, config, files) -> str:
    """Replace each marker with its generated Markdown table."""
    for marker, (module, function) in _MARKERS.items():
        if marker in markdown:
            table = getattr(importlib.import_module(module), function)()
            markdown = markdown.replace(marker, table)
    return markdown
