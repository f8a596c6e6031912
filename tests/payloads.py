"""Script payloads a hostile student puts in a lab0 submission, for the sanitizer and browser tests.

Every payload, when it runs, records its name in ``window.__pwned``, sets the page title, writes a file through
the Jupyter contents API (``pwned_<name>.txt``) and sets every grade of its submission to the maximum through the
formgrader's API. A browser test reads the marker, the title, the file and the gradebook; none may change.
"""
from __future__ import annotations

import json
from html.parser import HTMLParser
from pathlib import Path

import nbformat
from nbconvert import HTMLExporter
from traitlets.config import Config

from course.common.notebooks import make_submission, read_notebook, replace_cell_source
from course.grader.sanitize import SanitizeNotebook, clean_html, markdown2html

# A 1x1 red PNG.
PNG_BASE64 = ("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg==")
ANSWER_GID = "q1_3_answer"  # lab0's written answer (manually graded Markdown)
MATH_TEXT = r"E = mc^2"
TABLE_CELL_TEXT = "latency_ms"


def attack_js(name: str) -> str:
    """JavaScript (one line, no quotes of either kind that would need escaping in HTML attributes) doing the above."""
    return (
        "(function(){var w=window;w.__pwned=(w.__pwned||[]).concat([`" + name + "`]);document.title=`PWNED`;"
        "var m=document.cookie.match(/_xsrf=([^;]+)/);var h={};h[`Content-Type`]=`application/json`;"
        "if(m){h[`X-XSRFToken`]=decodeURIComponent(m[1]);}"
        "fetch(`/api/contents/pwned_" + name + ".txt`,{method:`PUT`,headers:h,"
        "body:JSON.stringify({type:`file`,format:`text`,content:`pwned`})}).catch(function(){});"
        "var s=location.pathname.split(`/submissions/`)[1];if(s){s=s.split(`/`)[0];"
        "fetch(`/formgrader/api/grades?submission_id=`+s,{headers:h}).then(function(r){return r.json();})"
        ".then(function(g){g.forEach(function(x){fetch(`/formgrader/api/grade/`+x.id,{method:`PUT`,headers:h,"
        "body:JSON.stringify({manual_score:x.max_score,extra_credit:99})});});}).catch(function(){});}})()"
    )


def markdown_answer() -> str:
    """A written answer with honest content (math, a table, an image) and script in raw HTML."""
    return "\n".join([
        "Because it is the simplest. The energy is $" + MATH_TEXT + "$.",
        "",
        f"| {TABLE_CELL_TEXT} | speedup |",
        "| --- | --- |",
        "| 1.5 | 2.0 |",
        "",
        f"![a figure](data:image/png;base64,{PNG_BASE64})",
        "",
        f"<script>{attack_js('md_script')}</script>",
        f'<img src="x" onerror="{attack_js("md_onerror")}">',
        f'<svg><script>{attack_js("md_svg")}</script></svg>',
        f'<iframe srcdoc="<script>{attack_js("md_iframe")}</script>"></iframe>',
        f"[click me](javascript:{attack_js('md_link')})",
        f'<details open ontoggle="{attack_js("md_ontoggle")}"><summary>more</summary>x</details>',
    ])


def svg_with_script(name: str) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="10" height="10" onload="{attack_js(name)}">'
            f'<script>{attack_js(name + "_inner")}</script><rect width="10" height="10"/></svg>')


def code_answer() -> str:
    """``add`` answered right, with every kind of output that could carry script shown by the cell."""
    bundles = {
        "out_html": {"text/html": f'<b>bold</b><img src="x" onerror="{attack_js("out_html")}">'},
        "out_js": {"application/javascript": attack_js("out_js")},
        "out_svg": {"image/svg+xml": svg_with_script("out_svg")},
        "out_markdown": {"text/markdown": f"*md* <img src=x onerror=\"{attack_js('out_markdown')}\">"},
        "out_widget": {"application/vnd.jupyter.widget-view+json": {"model_id": "x", "version_major": 2}},
        "out_png": {"image/png": PNG_BASE64},
    }
    lines = ["from IPython.display import display", "", "def add(a, b):", "    return a + b", ""]
    for name, bundle in bundles.items():
        lines.append(f"display({json.dumps(bundle)}, raw=True)  # {name}")
    png_metadata = {"image/png": {"width": f'1 onerror="{attack_js("out_png_width")}"'}}
    lines.append(f"display({json.dumps({'image/png': PNG_BASE64})}, raw=True, metadata={json.dumps(png_metadata)})")
    return "\n".join(lines)


def payload_submission(root):
    """The lab0 reference submission with the payloads in its written answer and in ``add``'s outputs."""
    source = read_notebook(root / "source" / "lab0" / "lab0.ipynb")
    release = read_notebook(root / "release" / "lab0" / "lab0.ipynb")
    nb = make_submission(release, source)
    nb = replace_cell_source(nb, ANSWER_GID, markdown_answer())
    return replace_cell_source(nb, "q1_1_add", code_answer())


def payload_names() -> list[str]:
    text = markdown_answer() + code_answer()
    return sorted({part.split("`")[0] for part in text.split("concat([`")[1:]})




def outputs_notebook() -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("x")
    cell.execution_count = f'1]<img src=x onerror="{attack_js("execution_count")}">'
    cell.outputs = [
        nbformat.v4.new_output("display_data", {"text/html": f'<img src=x onerror="{attack_js("html")}"><b>ok</b>'}),
        nbformat.v4.new_output("display_data", {"application/javascript": attack_js("js"), "text/plain": "<JS>"}),
        nbformat.v4.new_output("display_data", {"image/svg+xml": svg_with_script("svg")}),
        nbformat.v4.new_output("display_data", {"text/markdown": f"<script>{attack_js('markdown')}</script>"}),
        nbformat.v4.new_output("display_data", {"application/vnd.jupyter.widget-view+json": {"model_id": "m"}}),
        nbformat.v4.new_output("display_data", {"image/png": PNG_BASE64},
                               metadata={"image/png": {"width": "1 onerror=" + attack_js("png_width").replace(" ", "/**/"), "height": 20}}),
        nbformat.v4.new_output("display_data", {"image/png": f'" onerror="{attack_js("png_data")}'}),
        nbformat.v4.new_output("display_data", {"text/latex": f"${MATH_TEXT}$"}),
        nbformat.v4.new_output("stream", name="stdout", text="<script>printed</script>"),
    ]
    nb.cells = [cell, nbformat.v4.new_markdown_cell(markdown_answer())]
    nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": {}}}
    return nb



class _Scripts(HTMLParser):
    """The text of every script element and event-handler attribute of a page."""

    def __init__(self):
        super().__init__()
        self.texts: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag, attrs):
        self._in_script = tag == "script"
        self.texts += [value or "" for name, value in attrs if name.startswith("on") or
                       (name in ("href", "src") and (value or "").strip().lower().startswith("javascript:"))]

    def handle_data(self, data):
        if self._in_script:
            self.texts.append(data)

    def handle_endtag(self, tag):
        self._in_script = False


def student_script(page: str) -> list[str]:
    """Script in ``page`` that came from the payloads (they all mention ``__pwned``)."""
    parser = _Scripts()
    parser.feed(page)
    return [text[:80] for text in parser.texts if "__pwned" in text]


def export(nb, template: str, course_exporter: bool) -> str:
    """``nb`` as nbgrader renders it with ``template``: with the course's exporter settings, or stock nbconvert."""
    import nbgrader.server_extensions.formgrader.handlers as handlers

    config = Config()
    if course_exporter:  # what nbgrader_config.py sets
        config.HTMLExporter.preprocessors = [SanitizeNotebook]
        config.HTMLExporter.sanitize_html = True
        config.HTMLExporter.filters = {"markdown2html": markdown2html, "clean_html": clean_html}
    config.HTMLExporter.template_name = template
    config.HTMLExporter.extra_template_basedirs = [handlers.template_path]
    config.HTMLExporter.extra_template_paths = [str(Path(handlers.static_path, "node_modules", "bootstrap", "dist", "css"))]
    resources = {"nbgrader": {"notebook": "lab0", "score": 1, "max_score": 2, "late_penalty": 0},
                 "index": 0, "total": 1, "base_url": "", "assignment_id": "lab0", "notebook_id": "lab0",
                 "submission_id": "s", "student": "ada", "notebook_path": "lab0.ipynb"}
    return HTMLExporter(config=config).from_notebook_node(nb, resources=resources)[0]


def graded_payload_notebook():
    nb = outputs_notebook()
    nb.cells[1].metadata["nbgrader"] = {"grade_id": "q1_3_answer", "grade": True, "solution": True, "points": 2,
                                        "schema_version": 3, "locked": False, "score": 0, "comment": None}
    nb.cells[0].execution_count = None  # stock nbconvert writes it raw: the control below is about the rest
    return nb


