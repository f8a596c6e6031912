"""sanitize: nothing a student writes runs script where a TA or another student looks at it (docs/SECURITY.md).

Two layers, both named in ``nbgrader_config.py``: the ``SanitizeNotebook`` preprocessor (autograde and feedback)
rewrites the notebook, and ``markdown2html`` and ``clean_html`` replace nbconvert's filters of those names in every
HTML export. Markdown keeps its source unless its rendering leaves the allow-list below; anything outside it is
escaped (a ``<script>`` shows as text, so the TA sees the attempt) or dropped, other outputs become a note.
"""
from __future__ import annotations

import base64
import html
import re
import secrets
from html.parser import HTMLParser

import bleach
from bleach.css_sanitizer import CSSSanitizer
from jinja2 import pass_context
from nbconvert.filters.markdown_mistune import IPythonRenderer, MarkdownWithMath
from nbconvert.preprocessors import Preprocessor
from nbformat import from_dict
from traitlets import Bool

HEADINGS = ("h1", "h2", "h3", "h4", "h5", "h6")
ALLOWED_TAGS = frozenset({
    "a", "abbr", "b", "blockquote", "br", "caption", "cite", "code", "col", "colgroup", "dd", "del", "details",
    "dfn", "div", "dl", "dt", "em", "figcaption", "figure", "hr", "i", "img", "input", "ins", "kbd", "li", "mark",
    "ol", "p", "pre", "q", "s", "samp", "small", "span", "strike", "strong", "sub", "summary", "sup", "table",
    "tbody", "td", "tfoot", "th", "thead", "tr", "tt", "u", "ul", "var", *HEADINGS,
})
ALLOWED_CSS_PROPERTIES = frozenset({
    "text-align", "vertical-align", "color", "background-color", "font-weight", "font-style", "text-decoration",
    "white-space", "border", "border-collapse", "border-bottom", "border-top", "padding", "padding-left", "padding-right",
})
# Classes that a script of the page acts on (mermaid renders diagrams from them): never from a student.
SCRIPTED_CLASS = re.compile(r"mermaid", re.IGNORECASE)
CLASS_TOKEN = re.compile(r"^[A-Za-z0-9_-]+$")
LINK_SCHEMES = ("http", "https", "mailto")
IMAGE_DATA_PREFIXES = tuple(f"data:image/{kind}{sep}" for kind in ("png", "jpeg", "gif", "webp", "svg+xml") for sep in ";,")
NUMBER = re.compile(r"^\d{1,5}(\.\d{1,3})?%?$")
SAFE_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # nbformat's cell id pattern; also nbgrader's grade ids
# Output types shown as they are (after the checks below); everything else becomes a note.
TEXT_TYPES = ("text/plain", "text/latex")
RASTER_TYPES = ("image/png", "image/jpeg", "image/gif")
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def _scheme(url: str) -> str:
    """The URL's scheme in lower case ("" for a relative URL), the way a browser reads it (controls ignored)."""
    squeezed = re.sub(r"[\x00-\x20\x7f]", "", html.unescape(url))
    match = re.match(r"^([A-Za-z][A-Za-z0-9+.\-]*):", squeezed)
    return match.group(1).lower() if match else ""


def _safe_image(url: str) -> bool:
    """A relative or http(s) URL, or ``data:`` of an image type (an SVG loaded as an image runs no script)."""
    squeezed = re.sub(r"[\x00-\x20\x7f]", "", html.unescape(url)).lower()
    return _scheme(url) in ("", "https", "http") or squeezed.startswith(IMAGE_DATA_PREFIXES)


def attribute_allowed(tag: str, name: str, value: str) -> bool:
    """Whether ``name="value"`` may stay on a ``tag`` a student wrote (the attribute allow-list)."""
    if name == "class":
        return all(CLASS_TOKEN.match(t) and not SCRIPTED_CLASS.search(t) for t in value.split())
    if name == "title":
        return True
    if name == "style":
        return tag in ("span", "div", "p", "td", "th", "tr", "table", "code", "pre")  # CSS sanitized by bleach
    if name == "id":
        return tag in HEADINGS
    if tag == "a":
        return name == "href" and _scheme(value) in ("", *LINK_SCHEMES)
    if tag == "img":
        if name == "src":
            return _safe_image(value)
        return name == "alt" or (name in ("width", "height") and bool(NUMBER.match(value.strip())))
    if tag == "input":  # Markdown task lists: a disabled checkbox and nothing else
        return (name == "type" and value.lower() == "checkbox") or name in ("disabled", "checked")
    if tag in ("td", "th"):
        return (name == "align" and value.lower() in ("left", "right", "center")) or (
            name in ("colspan", "rowspan") and value.isdigit())
    if tag == "ol":
        return name == "start" and value.lstrip("-").isdigit()
    if tag == "table":
        return name == "border" and value.isdigit()
    if tag == "details":
        return name == "open"
    return False


_CLEANER = bleach.Cleaner(
    tags=ALLOWED_TAGS, attributes=attribute_allowed, protocols=[*LINK_SCHEMES, "data"], strip=False,
    strip_comments=True, css_sanitizer=CSSSanitizer(allowed_css_properties=ALLOWED_CSS_PROPERTIES),
)
_STYLE_BLOCK = re.compile(r"<style\b[^>]*>.*?</style\s*>", re.IGNORECASE | re.DOTALL)


def clean_html(text) -> str:
    """Sanitize an HTML fragment: allowed tags and attributes stay, other tags are escaped (shown as text).
    ``<style>`` blocks (pandas tables carry one) are dropped first, so their CSS does not show as text."""
    text = text.decode() if isinstance(text, bytes) else str(text)
    return _CLEANER.clean(_STYLE_BLOCK.sub("", text))


class _Checker(HTMLParser):
    """Finds anything in rendered HTML outside the allow-list (a tag, an attribute, a comment, a declaration)."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.problems: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag not in ALLOWED_TAGS:
            self.problems.append(f"<{tag}>")
        for name, value in attrs:
            if name == "style" or not attribute_allowed(tag, name, value or ""):
                self.problems.append(f"<{tag} {name}>")

    def handle_endtag(self, tag):
        if tag not in ALLOWED_TAGS:
            self.problems.append(f"</{tag}>")

    def handle_comment(self, data):  # also declarations and processing instructions: never allowed
        self.problems.append("<!...>")

    handle_decl = unknown_decl = handle_pi = handle_comment


def html_problems(rendered: str) -> list[str]:
    """What in ``rendered`` is outside the allow-list (empty: it may be shown as it is)."""
    checker = _Checker()
    checker.feed(rendered)
    checker.close()
    return checker.problems


class _RecordingRenderer(IPythonRenderer):
    """nbconvert's Markdown renderer, noting whether the source held raw HTML (passed through unescaped)."""

    raw_html = False

    def block_html(self, text):
        self.raw_html = True
        return super().block_html(text)

    def inline_html(self, text):
        self.raw_html = True
        return super().inline_html(text)


def _render(source: str, attachments: dict | None) -> tuple[str, bool]:
    """Markdown rendered as nbconvert's HTML exporter renders it, and whether it passed raw HTML through."""
    renderer = _RecordingRenderer(escape=False, attachments=attachments or {})
    return MarkdownWithMath(renderer=renderer).render(source), renderer.raw_html


FROZEN_START, FROZEN_END = '<div class="sanitized-html">', "</div>"


def _freeze(fragment: str) -> str:
    """Markdown that renders as exactly ``fragment``: one HTML block on one line (a blank line would end it)."""
    one_line = fragment.replace("\r\n", "\n").replace("\r", "\n").replace("\n", "&#10;")
    return FROZEN_START + one_line + FROZEN_END


def _is_frozen(source: str) -> bool:
    """Whether ``source`` is already what ``_freeze`` makes of sanitized HTML (so sanitizing twice is a no-op)."""
    if "\n" in source or not (source.startswith(FROZEN_START) and source.endswith(FROZEN_END)):
        return False
    inner = source[len(FROZEN_START):-len(FROZEN_END)].replace("&#10;", "\n")
    return _freeze(clean_html(inner)) == source


def render_markdown(source: str, attachments: dict | None = None) -> str:
    """Markdown to HTML, safe to show: nbconvert's rendering when it stays inside the allow-list, else sanitized."""
    try:
        rendered, raw_html = _render(source, attachments)
    except Exception:  # a missing attachment, a renderer bug: show the source as text
        return f"<pre>{html.escape(source)}</pre>"
    return rendered if not raw_html and not html_problems(rendered) else clean_html(rendered)


def sanitize_markdown(source: str, attachments: dict | None = None) -> str:
    """Markdown source that renders safely: ``source`` itself when it does, else its sanitized rendering."""
    escaped = _freeze(f"<pre>{html.escape(source)}</pre>")  # nothing but escaped text: always safe
    try:
        rendered, raw_html = _render(source, attachments)
    except Exception:  # a missing attachment, a renderer bug
        return escaped
    if (not raw_html or _is_frozen(source)) and not html_problems(rendered):
        return source
    frozen = _freeze(clean_html(rendered))
    return escaped if html_problems(_render(frozen, None)[0]) else frozen


@pass_context
def markdown2html(context, source: str) -> str:
    """Jinja filter replacing nbconvert's ``markdown2html`` in HTML exports (``render_markdown``)."""
    cell = context.get("cell") or {}
    return render_markdown(source, cell.get("attachments") if hasattr(cell, "get") else None)


def _text(value) -> str:
    return "".join(value) if isinstance(value, list) else str(value)


def _is_base64(value: str) -> bool:
    try:  # validate=True refuses any character outside the base64 alphabet
        base64.b64decode(re.sub(r"\s", "", value), validate=True)
    except ValueError:  # binascii.Error is one
        return False
    return True


def _note(kinds) -> str:
    return f"[{', '.join(sorted(kinds))} output removed: it could run script in the viewer's browser]"


def _sanitize_data(data: dict) -> tuple[dict, list[str]]:
    """Allowed output data (sanitized) and the mime types dropped."""
    kept, dropped = {}, []
    for mime, value in data.items():
        if mime in TEXT_TYPES:
            kept[mime] = _text(value)
        elif mime in RASTER_TYPES and isinstance(value, str) and _is_base64(value):
            kept[mime] = value
        elif mime == "text/html":
            kept[mime] = clean_html(_text(value))
        elif mime == "text/markdown":
            kept[mime] = sanitize_markdown(_text(value))
        elif mime == "image/svg+xml" and "text/html" not in data:
            encoded = base64.b64encode(_text(value).encode()).decode()
            kept["text/html"] = f'<img src="data:image/svg+xml;base64,{encoded}" alt="SVG output">'
        elif mime != "image/svg+xml":
            dropped.append(mime)
    return kept, dropped


def _filtered(bundles, keep) -> dict:
    """The dict values of ``bundles`` with only the items that ``keep(key, value)`` accepts; empty ones are dropped."""
    kept = {str(name): {key: value for key, value in bundle.items() if keep(key, value)}
            for name, bundle in (bundles or {}).items() if isinstance(bundle, dict)}
    return {name: bundle for name, bundle in kept.items() if bundle}


def _image_metadata(metadata) -> dict:
    """Only numeric width and height of images survive (templates write them into attributes)."""
    images = {mime: values for mime, values in (metadata or {}).items() if mime in RASTER_TYPES}
    return _filtered(images, lambda key, v: key in ("width", "height") and isinstance(v, (int, float))
                     and not isinstance(v, bool))


def _count(value):
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def sanitize_output(out) -> dict:
    """One code cell output, safe to render."""
    kind = out.get("output_type")
    if kind == "stream":
        return {"output_type": "stream", "name": out.get("name") if out.get("name") in ("stdout", "stderr") else "stdout",
                "text": _text(out.get("text", ""))}
    if kind == "error":
        return {"output_type": "error", "ename": _text(out.get("ename", "")), "evalue": _text(out.get("evalue", "")),
                "traceback": [_text(line) for line in out.get("traceback") or []]}
    if kind in ("display_data", "execute_result"):
        data = out.get("data") if isinstance(out.get("data"), dict) else {}
        kept, dropped = _sanitize_data(data)
        # A widget with a text fallback (tqdm's bar) just shows its text; anything else removed is said once.
        noted = [mime for mime in dropped if mime != WIDGET_VIEW or not kept]
        if noted or not kept:
            kept["text/plain"] = "\n".join(filter(None, [kept.get("text/plain"), _note(noted or ["empty"])]))
        clean = {"output_type": kind, "data": kept, "metadata": _image_metadata(out.get("metadata"))}
        if kind == "execute_result":
            clean["execution_count"] = _count(out.get("execution_count"))
        return clean
    return {"output_type": "stream", "name": "stdout", "text": _note([f"an unknown ({str(kind)[:40]!r})"])}


def _sanitize_attachments(attachments) -> dict:
    """Only base64 images survive."""
    return _filtered(attachments, lambda mime, v: mime in (*RASTER_TYPES, "image/svg+xml") and isinstance(v, str)
                     and _is_base64(v))


def sanitize_cell(cell) -> None:
    """Make one cell safe to render, in place."""
    if not SAFE_ID.match(str(cell.get("id", "x"))):
        cell["id"] = secrets.token_hex(8)
    metadata = cell.setdefault("metadata", {})
    grade_id = (metadata.get("nbgrader") or {}).get("grade_id")
    if grade_id is not None and not SAFE_ID.match(str(grade_id)):
        metadata.pop("nbgrader")  # templates write grade ids into HTML unescaped
    if isinstance(metadata.get("tags"), list):
        metadata["tags"] = [str(tag) for tag in metadata["tags"]]
    if cell.get("cell_type") == "markdown":
        if "attachments" in cell:
            cell["attachments"] = _sanitize_attachments(cell["attachments"])
        cell["source"] = sanitize_markdown(_text(cell.get("source", "")), cell.get("attachments"))
    elif cell.get("cell_type") == "raw":
        kind = str(metadata.get("raw_mimetype") or metadata.get("format") or "").lower()
        if not kind or "html" in kind:  # what HTML exports paste into the page
            cell["source"] = clean_html(_text(cell.get("source", "")))
    elif cell.get("cell_type") == "code":
        cell["execution_count"] = _count(cell.get("execution_count"))
        cell["outputs"] = [sanitize_output(out) for out in cell.get("outputs") or []]


def sanitize_notebook(nb):
    """Make a notebook safe to render in any browser, in place; returns it. Safe content is left unchanged."""
    metadata = nb.setdefault("metadata", {})
    metadata.pop("widgets", None)  # widget state renders through the widget manager's script
    if "title" in metadata and not isinstance(metadata["title"], str):
        metadata.pop("title")
    for cell in nb.get("cells", []):
        sanitize_cell(cell)
    return nb


class SanitizeNotebook(Preprocessor):
    """nbconvert/nbgrader preprocessor: ``sanitize_notebook`` (see the module docstring); on unless configured off."""

    enabled = Bool(True).tag(config=True)

    def preprocess(self, nb, resources):
        nb.cells = [from_dict(cell) for cell in sanitize_notebook(nb).cells]
        return nb, resources
