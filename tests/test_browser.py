"""The TA's and the student's paths in a real browser: headless Chromium on a JupyterLab server with the formgrader.

A class of the fixture lab with a plot question (tests/student_run_lab.py: tests/fixtures/lab0, a setup cell printing
the GPU, a measuring cell printing a table, Question 1.4 plotted and graded by hand) is graded with the course's
pipeline: ``ada`` submits the reference with the outputs of her own run (an H100, her table, her plot), ``mallory``
the reference with script payloads (tests/payloads.py) in her written answer, in her outputs and in the outputs her
notebook was submitted with. Then, in Chromium:

- the formgrader's page of mallory's submission, and her feedback HTML, run none of her script (no marker, title
  unchanged, no file written through the contents API, gradebook unchanged) and still show her answer, math and
  images; the same holds when her autograded notebook on disk is replaced by an unsanitized one (the exporter's
  own layer); as a control, stock nbconvert's rendering of the same notebook does run the payloads;
- the formgrader's page of ada's submission shows, under the grader's re-run, her own run marked as such (her GPU,
  her table, her plot), and the mark scheme right after each answer graded by hand; her feedback shows her run too,
  and no mark scheme or hidden test;
- a TA opens the formgrader, sees the gradebook, enters a manual score that reaches the gradebook database, and
  generates feedback with the formgrader's button; the feedback holds no hidden test line;
- a student opens the lab in JupyterLab, runs the setup cell, her answer and its public test, and sees it pass.

Chromium and its driver are Debian's packages (scripts/test.sh installs them as root); the tests skip without
them, and fail under CI=1.
"""
from __future__ import annotations

import shutil
import time
from pathlib import Path

import nbformat
import pytest
from browser import JupyterServer, require_browser, start_chromium, wait_for  # noqa: E402
from fixture_lab import LAB  # noqa: E402
from payloads import (  # noqa: E402
    ANSWER_GID,
    MATH_TEXT,
    TABLE_CELL_TEXT,
    export,
    markdown_answer,
    outputs_notebook,
    payload_submission,
)
from student_run_lab import (  # noqa: E402
    ANSWER_SCHEME,
    PLOT_GID,
    PLOT_SCHEME,
    STUDENT_GPU,
    STUDENT_TABLE_ROW,
    in_order,
    plot_lab_root,
    run_submission,
    with_student_run,
)

from course.cli.feedback import generate_feedback
from course.cli.grade import grade_lab
from course.cli.nbgrader_run import make_course_dir
from course.common.notebooks import make_submission, read_notebook, write_notebook
from course.common.paths import course_directory
from course.common.scores import read_scores
from course.grader.ta_view import GRADER_RUN, STUDENT_RUN

HIDDEN_TEST_LINES = ("add(-40, 17)", "scale(0.5, 7.25)", "square(-9)")
# After a page has loaded, how long its scripts (a payload's requests included) are given before the checks.
SETTLE_S = 2
MANUAL_SCORE = 1.5


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """The fixture lab with a plot question built, a course folder with ada and mallory graded, and a student's
    working copy."""
    require_browser()
    base = tmp_path_factory.mktemp("browser")
    root = plot_lab_root(base / "repo")
    course = make_course_dir(base / "course", [LAB], root)
    source = read_notebook(root / "source" / LAB / f"{LAB}.ipynb")
    release = read_notebook(root / "release" / LAB / f"{LAB}.ipynb")
    write_notebook(run_submission(root), course / "submitted" / "ada" / LAB / f"{LAB}.ipynb")
    mallory = with_student_run(payload_submission(root), hostile=True)
    write_notebook(mallory, course / "submitted" / "mallory" / LAB / f"{LAB}.ipynb")
    outcomes, _ = grade_lab(course, LAB, progress=False, workers=2)
    assert all(o.status == "ok" for o in outcomes.values()), outcomes
    # A student who copied release/lab0 out and answered Question 1.1 (the served folder holds it, beside the course).
    work = course / "student_work" / LAB
    shutil.copytree(root / "release" / LAB, work)
    write_notebook(make_submission(release, source, {"q1_1_add"}), work / f"{LAB}.ipynb")
    return {"course": course, "root": root}


@pytest.fixture(scope="module")
def server(graded, tmp_path_factory):
    jupyter = JupyterServer(graded["course"], tmp_path_factory.mktemp("jupyter-state")).start()
    yield jupyter
    jupyter.stop()


@pytest.fixture(scope="module")
def browser(graded, server, tmp_path_factory):
    driver = start_chromium(tmp_path_factory.mktemp("chromium-profile"))
    server.login(driver)
    yield driver
    driver.quit()


def submission_id(course: Path, student: str) -> str:
    from nbgrader.api import Gradebook

    with Gradebook(course_directory(course).db_url, course_id="efficient-ai") as gb:
        return gb.find_submission_notebook(LAB, LAB, student).id


def grades_of(course: Path, student: str) -> dict[str, tuple]:
    cells = read_scores(course, LAB, [student])[student].cells
    return {gid: (cell.auto_score, cell.manual_score) for gid, cell in cells.items()}


def written_files(course: Path) -> list[Path]:
    return sorted(course.rglob("pwned_*"))


def open_and_settle(browser, url: str, ready_text: str) -> None:
    browser.get(url)
    wait_for(browser, lambda d: d.execute_script("return document.readyState") == "complete", what="the page load")
    wait_for(browser, lambda d: ready_text in d.find_element("tag name", "body").text, what=repr(ready_text))
    time.sleep(SETTLE_S)


def ran_scripts(browser) -> list[str]:
    """What the payloads recorded in ``window.__pwned`` (a list of names, or a bare value set by a short one)."""
    marker = browser.execute_script("return window.__pwned === undefined ? [] : window.__pwned")
    return [str(name) for name in marker] if isinstance(marker, list) else [str(marker)]


def assert_nothing_ran_and_content_shows(browser, course: Path, before: dict, where: str) -> None:
    assert ran_scripts(browser) == [], f"{where}: student script ran: {ran_scripts(browser)}"
    assert browser.title != "PWNED", f"{where}: student script set the title"
    assert written_files(course) == [], f"{where}: student script wrote {written_files(course)}"
    assert grades_of(course, "mallory") == before, f"{where}: mallory's grades changed"
    text = browser.find_element("tag name", "body").text
    assert "Because it is the simplest" in text and TABLE_CELL_TEXT in text, f"{where}: the answer must show"
    math = browser.execute_script("return document.querySelectorAll('.MathJax, mjx-container, .MathJax_Display').length")
    assert math > 0 or MATH_TEXT in text, f"{where}: the answer's math must reach the page intact (or be typeset)"
    images = browser.execute_script(
        "return Array.from(document.images).filter(i => i.src.startsWith('data:image/png'))"
        ".map(i => i.complete && i.naturalWidth > 0)")
    assert len(images) >= 2 and all(images), f"{where}: the PNG in the answer and the PNG output must load: {images}"


def test_formgrader_page_of_a_hostile_submission_runs_no_script(graded, server, browser):
    course = graded["course"]
    before = grades_of(course, "mallory")
    url = server.url(f"/formgrader/submissions/{submission_id(course, 'mallory')}/")
    open_and_settle(browser, url, "Because it is the simplest")
    assert_nothing_ran_and_content_shows(browser, course, before, "formgrader")
    assert browser.find_elements("css selector", f"input.score#{ANSWER_GID}"), "the manual score box must show"


def test_formgrader_sanitizes_an_unsanitized_autograded_notebook(graded, server, browser):
    """Defence in depth: a notebook graded without the course's autograde settings is still shown safely."""
    course = graded["course"]
    path = course / "autograded" / "mallory" / LAB / f"{LAB}.ipynb"
    saved = path.read_bytes()
    nb = read_notebook(path)
    raw = outputs_notebook()
    for cell in nb.cells:
        gid = cell.metadata.get("nbgrader", {}).get("grade_id")
        if gid == ANSWER_GID:
            cell.source = markdown_answer()
        elif gid == "q1_1_add":
            cell.outputs = raw.cells[0].outputs  # (a forged execution count makes nbconvert refuse the page)
    nbformat.write(nb, str(path))
    try:
        before = grades_of(course, "mallory")
        open_and_settle(browser, server.url(f"/formgrader/submissions/{submission_id(course, 'mallory')}/"),
                        "Because it is the simplest")
        assert_nothing_ran_and_content_shows(browser, course, before, "formgrader (unsanitized notebook)")
    finally:
        path.write_bytes(saved)


def test_feedback_html_of_a_hostile_submission_runs_no_script(graded, browser):
    course = graded["course"]
    before = grades_of(course, "mallory")
    [page] = generate_feedback(course, LAB, ["mallory"])
    open_and_settle(browser, page.as_uri(), "Because it is the simplest")
    assert_nothing_ran_and_content_shows(browser, course, before, "feedback")


# The labels of the grader's re-run (G) and of the student's run (S), and loaded PNG images (I), in page order
# below ``arguments[0]``: a label is an output ``div`` holding only its text.
RUN_SEQUENCE_JS = """
const [root, grader, student] = arguments, seen = [];
const walk = document.createTreeWalker(root, NodeFilter.SHOW_ELEMENT);
while (walk.nextNode()) {
  const el = walk.currentNode, text = el.children.length ? '' : el.textContent.trim();
  if (el.tagName === 'DIV' && text.startsWith(grader)) seen.push('G');
  else if (el.tagName === 'DIV' && text.startsWith(student)) seen.push('S');
  else if (el.tagName === 'IMG' && el.src.startsWith('data:image/png') && el.complete && el.naturalWidth > 0) seen.push('I');
}
return seen.join('');
"""


def run_sequence(browser, root) -> str:
    return browser.execute_script(RUN_SEQUENCE_JS, root, GRADER_RUN, STUDENT_RUN)


def assert_the_student_run_shows(browser, where: str) -> None:
    """The setup cell's and the measuring cell's outputs: the grader's re-run, then the student's, each labelled."""
    text = browser.find_element("tag name", "body").text
    assert in_order(text, GRADER_RUN, "GPU: none found", STUDENT_RUN, STUDENT_GPU), (
        f"{where}: the student's GPU must show as the student's run, after the grader's re-run")
    assert in_order(text, STUDENT_GPU, GRADER_RUN, "n | latency_ms", STUDENT_RUN, STUDENT_TABLE_ROW), (
        f"{where}: the student's measured table must show as the student's run, after the grader's")


def test_formgrader_shows_the_student_run_and_the_mark_scheme(graded, server, browser):
    course = graded["course"]
    open_and_settle(browser, server.url(f"/formgrader/submissions/{submission_id(course, 'ada')}/"), STUDENT_RUN)
    assert_the_student_run_shows(browser, "formgrader")
    plot_cell = browser.execute_script(f"return document.getElementById('{PLOT_GID}').closest('.cell')")
    assert run_sequence(browser, plot_cell) == "GSI", (
        "the plot question must show the student's plot under the student's run (the grader's re-run has none): "
        f"{run_sequence(browser, plot_cell)!r}")
    for gid, scheme in ((ANSWER_GID, ANSWER_SCHEME), (PLOT_GID, PLOT_SCHEME)):
        after = browser.execute_script(
            f"return document.getElementById('{gid}').closest('.cell').nextElementSibling.innerText")
        assert "Mark scheme" in after and scheme in after, (
            f"the mark scheme of {gid} must follow the answer where the TA scores it: {after[:300]!r}")
    assert ran_scripts(browser) == [], ran_scripts(browser)


def test_feedback_shows_the_student_run_and_no_mark_scheme(graded, browser):
    [page] = generate_feedback(graded["course"], LAB, ["ada"])
    open_and_settle(browser, page.as_uri(), STUDENT_RUN)
    assert_the_student_run_shows(browser, "feedback")
    body = browser.find_element("tag name", "body")
    assert "GSI" in run_sequence(browser, body), "feedback must show the student's plot under the student's run"
    html = browser.page_source
    shown = [text for text in ("Mark scheme", ANSWER_SCHEME, PLOT_SCHEME, *HIDDEN_TEST_LINES) if text in html]
    assert not shown, f"feedback must show no mark scheme and no hidden test: {shown}"


def test_control_stock_nbconvert_page_runs_the_payloads(graded, browser, tmp_path):
    """Without the course's sanitizer the same content does run in this browser (so the checks above can fail)."""
    nb = outputs_notebook()
    nb.cells[0].execution_count = None
    page = tmp_path / "stock.html"
    page.write_text(export(nb, "feedback", course_exporter=False))
    browser.get(page.as_uri())
    wait_for(browser, lambda d: len(ran_scripts(d)) > 0, timeout_s=30, what="the control's payloads to run")
    time.sleep(1)
    ran = sorted(set(map(str, ran_scripts(browser))))
    print(f"control: payloads that ran in stock nbconvert's feedback page: {ran}")
    assert len(ran) >= 3, f"control: several payloads must run unsanitized, ran: {ran}"


def test_ta_grades_by_hand_and_generates_feedback_in_the_formgrader(graded, server, browser):
    course = graded["course"]
    open_and_settle(browser, server.url("/formgrader/manage_assignments"), LAB)
    open_and_settle(browser, server.url(f"/formgrader/gradebook/{LAB}/{LAB}"), "Submission")
    rows = browser.find_elements("css selector", "table tbody tr")
    assert len(rows) == 2, f"the gradebook must list both submissions, shows {len(rows)} rows"
    # Scores read as the lab states them: out of the core points, bonus on top (ada: 3 + 2 + the 1 bonus point, her
    # written answer and plot not graded yet; the lab is out of 8 + 1 bonus).
    texts = [row.text for row in rows]
    assert any("6 / 8" in text for text in texts) and all(" / 8" in text for text in texts), (
        f"the formgrader must show each submission out of the core 8 points, bonus included in the score: {texts}")

    open_and_settle(browser, server.url(f"/formgrader/submissions/{submission_id(course, 'ada')}/"), "Question 1.3")
    from selenium.webdriver.common.keys import Keys

    box = browser.find_element("css selector", f"input.score#{ANSWER_GID}")
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'});", box)
    box.clear()
    # Tab leaves the box, which saves it (a click on the comment box can land on a page still laying out).
    box.send_keys(str(MANUAL_SCORE), Keys.TAB)
    deadline = time.monotonic() + 30
    while grades_of(course, "ada")[ANSWER_GID][1] != MANUAL_SCORE and time.monotonic() < deadline:
        time.sleep(0.5)
    assert grades_of(course, "ada")[ANSWER_GID][1] == MANUAL_SCORE, "the manual score must be saved in the gradebook"

    feedback = course / "feedback" / "ada" / LAB / f"{LAB}.html"
    if feedback.exists():
        feedback.unlink()
    open_and_settle(browser, server.url("/formgrader/manage_assignments"), LAB)
    browser.find_element("css selector", ".generate-feedback a").click()
    wait_for(browser, lambda d: d.find_elements("css selector", "#success-modal, #error-modal"), timeout_s=120,
             what="the result of Generate Feedback")
    assert browser.find_elements("css selector", "#success-modal"), (
        "Generate Feedback must succeed: " + browser.find_element("tag name", "body").text[-2000:])
    html = feedback.read_text()
    leaked = [line for line in HIDDEN_TEST_LINES if line in html]
    assert not leaked, f"the formgrader's feedback must hold no hidden test line, holds {leaked}"
    assert "hidden tests ran here" in html and str(MANUAL_SCORE) in html


def test_student_runs_setup_and_a_public_test_in_jupyterlab(graded, server, browser):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys

    browser.get(server.url(f"/lab/tree/student_work/{LAB}/{LAB}.ipynb"))
    wait_for(browser, lambda d: d.find_elements("css selector", ".jp-Notebook .jp-CodeCell"), timeout_s=120,
             what="the notebook to open in JupyterLab")
    wait_for(browser, lambda d: d.find_elements("css selector", ".jp-Notebook-ExecutionIndicator[data-status='idle']"),
             timeout_s=120, what="the kernel to be idle")
    dirty = browser.find_elements("css selector", ".lm-TabBar-tab.jp-mod-dirty")
    assert not dirty, ("opening a released notebook must not mark it modified (course/cli/build.py writes the kernel's "
                       f"full language_info): {[tab.text for tab in dirty]}")

    def find_code_cell(text: str):
        from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException

        for cell in browser.find_elements("css selector", ".jp-Notebook .jp-CodeCell"):
            try:
                if text in cell.find_element("css selector", ".jp-InputArea-editor").text:
                    return cell
            except (NoSuchElementException, StaleElementReferenceException):  # a cell still being rendered
                continue
        return None

    def code_cell(text: str):
        # JupyterLab fills the cell editors a moment after the cells appear (later still on a busy machine).
        return wait_for(browser, lambda d: find_code_cell(text), timeout_s=60, what=f"a code cell showing {text!r}")

    for marker in ("import math", "def add(a, b)", "assert add(1, 2) == 3"):
        cell = code_cell(marker)
        cell.find_element("css selector", ".jp-InputArea-editor").click()
        ActionChains(browser).key_down(Keys.SHIFT).send_keys(Keys.ENTER).key_up(Keys.SHIFT).perform()
        wait_for(browser, lambda d, c=cell: c.find_element("css selector", ".jp-InputPrompt").text.strip("[]: *") != "",
                 timeout_s=60, what=f"the cell {marker!r} to run")
    test_cell = code_cell("assert add(1, 2) == 3")
    prompt = test_cell.find_element("css selector", ".jp-InputPrompt").text
    errors = test_cell.find_elements("css selector", "[data-mime-type='application/vnd.jupyter.stderr']")
    assert prompt.strip("[]: ").isdigit() and not errors, (
        f"the public test must run and pass: prompt {prompt!r}, outputs {[e.text for e in errors]}")
