"""From a fetched body to the text the model reads: HTML rendered as blocks, everything else
passed through, with a header and the truncation markers."""

from __future__ import annotations

import re
from typing import Any

from relaykit.web.fetch import HTML_TYPES, FetchedPage

#: Elements whose content is never text a reader wants.
SKIPPED_TAGS = frozenset(
    {
        "script",
        "style",
        "noscript",
        "template",
        "svg",
        "math",
        "nav",
        "iframe",
        "object",
        "embed",
        "canvas",
        "select",
        "datalist",
        "head",
    }
)
_HEADINGS = {f"h{n}": n for n in range(1, 7)}
_BLOCK_TAGS = frozenset(
    {
        "p",
        "div",
        "section",
        "article",
        "main",
        "header",
        "footer",
        "aside",
        "blockquote",
        "figure",
        "figcaption",
        "table",
        "tr",
        "ul",
        "ol",
        "dl",
        "dt",
        "dd",
        "form",
        "fieldset",
        "address",
        "details",
        "summary",
        "body",
        "html",
        "hr",
        "caption",
        "li",
        "pre",
        *_HEADINGS,
    }
)
_CELL_TAGS = frozenset({"td", "th"})
_SPACE = re.compile(r"\s+")
_BREAK = "\x00"  # a <br> inside a block, until the block is flushed


class _Blocks:
    """Turns the parsed tree's elements into text blocks (headings, paragraphs, list items)."""

    def __init__(self) -> None:
        self.blocks: list[tuple[bool, str]] = []
        """(is a list item, text) per block."""
        self._inline: list[str] = []
        self._prefix = ""
        self._pre = 0

    def flush(self) -> None:
        if self._pre:
            text = "".join(self._inline).strip("\n")
            text = "\n".join(line.rstrip() for line in text.splitlines())
        else:
            text = _SPACE.sub(" ", "".join(self._inline))
            text = "\n".join(line.strip() for line in text.split(_BREAK) if line.strip())
        if text:
            self.blocks.append((self._prefix == "- ", self._prefix + text))
        self._inline = []
        self._prefix = ""

    def start(self, tag: str, attrs: dict[str, str | None]) -> None:
        if tag in _BLOCK_TAGS:
            self.flush()
        if tag in _HEADINGS:
            self._prefix = "#" * _HEADINGS[tag] + " "
        elif tag == "li":
            self._prefix = "- "
        elif tag == "pre":
            self._pre += 1
        elif tag == "br":
            self._inline.append("\n" if self._pre else _BREAK)
        elif tag in _CELL_TAGS:
            self._inline.append(" ")
        elif tag == "img" and (attrs.get("alt") or "").strip():
            self._inline.append(f" [{(attrs['alt'] or '').strip()}] ")

    def end(self, tag: str) -> None:
        if tag in _BLOCK_TAGS:
            self.flush()
        if tag == "pre":
            self._pre -= 1

    def text(self, data: str) -> None:
        self._inline.append(data)


def _skipped(tag: str, attrs: dict[str, str | None]) -> bool:
    return (
        tag in SKIPPED_TAGS
        or tag.startswith(("-", "_"))  # comments, doctype
        or "hidden" in attrs
        or (attrs.get("aria-hidden") or "").lower() == "true"
    )


def _title(tree: Any) -> str:
    """The document's ``<title>`` (not an SVG or MathML one, which names a drawing)."""
    for node in tree.css("title"):
        ancestor = node.parent
        while ancestor is not None and ancestor.tag not in ("svg", "math"):
            ancestor = ancestor.parent
        if ancestor is None:
            return _SPACE.sub(" ", node.text(deep=True)).strip()
    return ""


def html_to_text(html: str) -> tuple[str | None, str]:
    """``(title, text)`` of an HTML document: headings (as ``#`` lines), paragraphs and list
    items (``- ``) one per block, without scripts, styles, navigation or hidden elements.

    The page is parsed by selectolax (the Lexbor HTML5 parser), so sloppy markup becomes the
    tree a browser would build; only the rendering of that tree into blocks is ours."""
    from selectolax.lexbor import (
        LexborHTMLParser,  # loaded by the workers that fetch pages
    )

    tree = LexborHTMLParser(html)
    title = _title(tree)
    reader = _Blocks()
    root = tree.body or tree.root
    # An explicit stack rather than recursion: a page may nest elements thousands deep.
    stack: list[tuple[Any, bool]] = [(root, False)] if root is not None else []
    while stack:
        node, closing = stack.pop()
        if closing:
            reader.end(node.tag)
        elif node.is_text_node:
            reader.text(node.text_content or "")
        elif not _skipped(node.tag, node.attributes):
            reader.start(node.tag, node.attributes)
            stack.append((node, True))
            stack.extend((child, False) for child in reversed(list(node.iter(include_text=True))))
    reader.flush()
    parts: list[str] = []
    previous_item = False
    for is_item, block in reader.blocks:
        if parts:
            parts.append("\n" if is_item and previous_item else "\n\n")  # lists stay together
        parts.append(block)
        previous_item = is_item
    return title or None, "".join(parts)


def _normalise_text(text: str) -> str:
    lines = [line.rstrip() for line in text.replace("\r\n", "\n").replace("\r", "\n").split("\n")]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()


def render_page(page: FetchedPage, max_chars: int) -> str:
    """The text the model reads: a short header (URL, title) and the readable content."""
    sniffed_html = page.body.lstrip()[:15].lower().startswith(("<!doctype html", "<html"))
    if page.content_type in HTML_TYPES or (not page.content_type and sniffed_html):
        title, text = html_to_text(page.body)
    else:
        title, text = None, _normalise_text(page.body)
    header = [f"URL: {page.url}"]
    if page.url != page.requested_url:
        header[0] += f" (redirected from {page.requested_url})"
    if title:
        header.append(f"Title: {title}")
    if page.content_type and page.content_type not in HTML_TYPES:
        header.append(f"Content-Type: {page.content_type}")
    notes = []
    if page.truncated_bytes:
        notes.append(
            f"[… page truncated by fetch_url: only its first {page.max_bytes:,} bytes were read]"
        )
    body = text or "(no readable text on this page)"
    result = "\n".join(header) + "\n\n" + body
    if len(result) > max_chars:
        dropped = len(result) - max_chars
        result = result[:max_chars] + (
            f"\n\n[… truncated by fetch_url: {dropped:,} more characters not shown]"
        )
    elif notes:
        result += "\n\n" + "\n".join(notes)
    return result
