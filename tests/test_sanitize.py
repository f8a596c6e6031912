"""The sanitizer (course/grader/sanitize.py): payloads lose their script, honest content keeps its source and rendering.

The real-browser proof is tests/test_browser.py; these tests are fast and run everywhere.
"""
from __future__ import annotations

import copy
import re
from html.parser import HTMLParser

import nbformat
import pytest
from payloads import (  # noqa: E402
    MATH_TEXT,
    PNG_BASE64,
    export,
    graded_payload_notebook,
    outputs_notebook,
    student_script,
)

from course.grader.sanitize import (
    clean_html,
    html_problems,
    render_markdown,
    sanitize_markdown,
    sanitize_notebook,
    sanitize_output,
)

HONEST_MARKDOWN = "\n".join([
    "# Answer", "", "The speedup is $\\frac{t_1}{t_2} < 2$ and", "",
    "$$\\begin{aligned} a &= b \\\\ c &< d \\end{aligned}$$", "",
    "| latency_ms | x |", "| --- | --- |", "| 1 | 2 |", "",
    "```python", "if a < b and c > d: pass", "```", "",
    "![roofline](assets/roofline.png) and [docs](https://pytorch.org) and `x<y`", "",
    "> a quote", "", "- [x] done", "1. first",
])
MARKDOWN_PAYLOADS = {
    "script": "<script>window.x=1</script>",
    "onerror": '<img src=x onerror="window.x=1">',
    "svg": "<svg><script>window.x=1</script></svg>",
    "svg-onload": '<svg onload="window.x=1"></svg>',
    "iframe": "<iframe srcdoc='<script>parent.x=1</script>'></iframe>",
    "link": "[click](javascript:window.x=1)",
    "link-entity": "[click](jav&#x61;script:window.x=1)",
    "data-link": "<a href='data:text/html,<script>window.x=1</script>'>x</a>",
    "style": "<style>body{display:none}</style>",
    "link-tag": "<link rel=stylesheet href=https://example.org/x.css>",
    "css-position": '<div style="position:fixed;top:0;left:0;width:100%;height:100%">fake grade form</div>',
    "mermaid": "```mermaid\n<img src=x onerror=window.x=1>\n```",
    "object": "<object data='data:text/html,<script>window.x=1</script>'></object>",
    "form": "<form action=/formgrader/api/grade/1 method=post><button>ok</button></form>",
    "meta": "<meta http-equiv=refresh content='0;url=javascript:window.x=1'>",
    "comment-breakout": "<!--><img src=x onerror=window.x=1>-->",
    "attachment": "![a](attachment:evil.html)",
}
SCRIPTING_TAGS = {"script", "iframe", "object", "embed", "svg", "style", "link", "meta", "form", "base", "frame"}


class _Markup(HTMLParser):
    """Real tags and attributes of an HTML fragment (escaped text such as ``&lt;script`` is not markup)."""

    def __init__(self):
        super().__init__()
        self.found: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag in SCRIPTING_TAGS:
            self.found.append(f"<{tag}>")
        for name, value in attrs:
            value = (value or "").lower().replace(" ", "")
            if (name.startswith("on") or (name in ("href", "src") and value.startswith("javascript:"))
                    or (name == "style" and "position" in value) or (name == "class" and "mermaid" in value)):
                self.found.append(f"<{tag} {name}={value[:30]}>")

    handle_startendtag = handle_starttag


def executable_parts(html: str) -> list[str]:
    """Tags and attributes in ``html`` through which script could run (or the page be redressed)."""
    parser = _Markup()
    parser.feed(html)
    return parser.found


def test_honest_markdown_keeps_its_exact_source():
    assert sanitize_markdown(HONEST_MARKDOWN) == HONEST_MARKDOWN
    rendered = render_markdown(HONEST_MARKDOWN)
    assert html_problems(rendered) == [], "nbconvert's rendering of plain Markdown must be inside the allow-list"
    assert "<table>" in rendered and "assets/roofline.png" in rendered and "&lt; 2$" in rendered


@pytest.mark.parametrize("name", sorted(MARKDOWN_PAYLOADS))
def test_markdown_payload_is_neutralised(name):
    attachments = {"evil.html": {"text/html": "PHNjcmlwdD4="}} if name == "attachment" else None
    source = f"Honest $x_1$ text.\n\n{MARKDOWN_PAYLOADS[name]}\n"
    sanitized = sanitize_markdown(source, attachments)
    assert sanitized != source, f"{name}: the payload must be rewritten"
    rendered = render_markdown(sanitized)
    assert executable_parts(rendered) == [], f"{name}: rendered sanitized Markdown still carries {rendered!r}"
    assert html_problems(rendered) == []
    assert "$x_1$" in rendered, f"{name}: the honest math must survive: {rendered!r}"
    assert sanitize_markdown(sanitized) == sanitized or executable_parts(render_markdown(sanitize_markdown(sanitized))) == []


def test_the_render_filter_alone_makes_payloads_safe():
    for name, payload in MARKDOWN_PAYLOADS.items():
        assert executable_parts(render_markdown(payload)) == [], name


def test_script_shows_as_text_so_the_ta_sees_the_attempt():
    rendered = render_markdown(sanitize_markdown("see <script>alert(1)</script>"))
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in rendered


def test_clean_html_keeps_tables_and_images_and_drops_script():
    frame = ('<style scoped>.x{}</style><table border="1" class="dataframe"><thead><tr style="text-align: right;">'
             '<th>latency_ms</th></tr></thead><tbody><tr><td>1.5</td></tr></tbody></table>')
    cleaned = clean_html(frame)
    assert '<table border="1" class="dataframe">' in cleaned and "<td>1.5</td>" in cleaned and "<style" not in cleaned
    image = f'<img src="data:image/png;base64,{PNG_BASE64}" width="40">'
    assert clean_html(image) == image
    for bad in ('<img src="data:text/html,x">', '<a href="JaVaScRiPt:x">a</a>', '<img src=x onerror=y>'):
        assert executable_parts(clean_html(bad)) == [] and "data:text" not in clean_html(bad), bad


def test_outputs_keep_only_safe_types():
    nb = sanitize_notebook(outputs_notebook())
    outputs = nb.cells[0].outputs
    assert nb.cells[0].execution_count is None, "a forged execution count is written raw by the templates"
    assert outputs[0]["data"]["text/html"].endswith("<b>ok</b>") and "onerror" not in outputs[0]["data"]["text/html"]
    assert set(outputs[1]["data"]) == {"text/plain"} and "application/javascript output removed" in outputs[1]["data"]["text/plain"]
    assert outputs[2]["data"]["text/html"].startswith('<img src="data:image/svg+xml;base64,'), "SVG is shown as an image"
    assert executable_parts(render_markdown(outputs[3]["data"]["text/markdown"])) == []
    assert "widget-view" in outputs[4]["data"]["text/plain"]
    assert outputs[5]["data"]["image/png"] == PNG_BASE64 and outputs[5]["metadata"] == {"image/png": {"height": 20}}
    assert "image/png" not in outputs[6]["data"], "image data that is not base64 would break out of src=\"...\""
    assert outputs[7]["data"]["text/latex"] == f"${MATH_TEXT}$"
    assert outputs[8] == {"output_type": "stream", "name": "stdout", "text": "<script>printed</script>"}
    assert "widgets" not in nb.metadata
    nbformat.validate(nb)


def test_a_widget_with_a_text_fallback_shows_its_text_without_a_note():
    bar = {"output_type": "display_data", "metadata": {},
           "data": {"application/vnd.jupyter.widget-view+json": {"model_id": "m"}, "text/plain": "100%|##| 3/3"}}
    assert sanitize_output(bar)["data"] == {"text/plain": "100%|##| 3/3"}


def test_unknown_output_type_becomes_a_note():
    assert "removed" in sanitize_output({"output_type": "evil", "data": {}})["text"]


def test_safe_notebook_is_unchanged_and_sanitizing_twice_changes_nothing():
    nb = nbformat.v4.new_notebook()
    code = nbformat.v4.new_code_cell("print(1)", execution_count=3)
    code.outputs = [nbformat.v4.new_output("stream", name="stdout", text="1\n"),
                    nbformat.v4.new_output("execute_result", {"text/plain": "2", "image/png": PNG_BASE64},
                                           execution_count=3)]
    nb.cells = [nbformat.v4.new_markdown_cell(HONEST_MARKDOWN), code]
    before = copy.deepcopy(nb)
    assert sanitize_notebook(nb) == before
    hostile = sanitize_notebook(outputs_notebook())
    assert sanitize_notebook(copy.deepcopy(hostile)) == hostile


def test_grade_ids_and_cell_ids_that_break_out_of_attributes_are_dropped():
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_markdown_cell("x")
    cell.id = 'a"><script>'
    cell.metadata["nbgrader"] = {"grade_id": '"><img src=x onerror=alert(1)>', "grade": True, "points": 1}
    nb.cells = [cell]
    sanitize_notebook(nb)
    assert re.match(r"^[A-Za-z0-9_-]+$", nb.cells[0].id) and "nbgrader" not in nb.cells[0].metadata


@pytest.mark.parametrize("template", ["feedback", "formgrade"])
@pytest.mark.parametrize("layer", ["autograded-notebook", "exporter"])
def test_feedback_and_formgrade_pages_carry_no_student_script(template, layer):
    """Each layer alone suffices: the sanitized notebook in stock nbconvert, or the raw one in the course's exporter."""
    nb = graded_payload_notebook()
    if layer == "autograded-notebook":
        nb = sanitize_notebook(nb)
    page = export(nb, template, course_exporter=layer == "exporter")
    assert student_script(page) == [], f"student script in the {template} page"
    assert MATH_TEXT in page and "latency_ms" in page and PNG_BASE64 in page, "answers, math and images still render"


def test_control_stock_nbconvert_runs_the_payloads():
    page = export(graded_payload_notebook(), "feedback", course_exporter=False)
    assert len(student_script(page)) >= 4, "control: unsanitized, the payloads do reach the page as script"
