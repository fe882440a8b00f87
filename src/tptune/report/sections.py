"""Placing a stage's own section and its line on the answer card into report.md (confirm, packing)."""
from __future__ import annotations

ANCHOR = "\n## How it was measured"      # sections go after the answer card, before this heading


def insert(text: str, section: str, headline: str, headline_before: str) -> str:
    """``text`` with ``headline`` in the card before the paragraph starting ``headline_before``, and ``section``
    after the card (before ANCHOR; at the end when there is none)."""
    if headline:
        i = text.find(headline_before)
        if i >= 0:
            text = text[:i + 1] + headline + "\n\n" + text[i + 1:]
    if not section:
        return text
    i = text.find(ANCHOR)
    return text + "\n" + section if i < 0 else text[:i + 1] + section + "\n" + text[i + 1:]
