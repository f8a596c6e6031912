"""A lab renumbers its questions without renaming grade ids (issue 52): the heading names its grade ids in an HTML
comment (``#### Question 2.3 (3 points) <!-- grade ids q2_7_* -->``), and lint, the points table and the feedback's
labels follow the heading. Small notebooks built here; no lab is run."""
from __future__ import annotations

import nbformat

from course.cli.feedback import question_rows
from course.cli.lint import check_points, check_points_table
from course.common.notebooks import find_headings, question_labels


def _graded(gid: str, points: int):
    cell = nbformat.v4.new_code_cell("pass")
    cell.metadata["nbgrader"] = {"grade": True, "grade_id": gid, "locked": True, "points": points,
                                 "schema_version": 3, "solution": False, "task": False}
    return cell


def _lab(heading: str, row: str = "| Question 2.3 | `roofline_estimate` | 3 |", total: str = "3"):
    table = f"# Lab\n\n| Question | Topic | Points |\n| --- | --- | --- |\n{row}\n| **Total** | | **{total}** |\n"
    return nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(table), nbformat.v4.new_markdown_cell(heading),
                                           _graded("q2_7_roofline_estimate_tests", 3)])


def test_a_heading_that_names_its_grade_ids_maps_to_them():
    nb = _lab("## The roofline model\n\n#### Question 2.3 (3 points) <!-- grade ids q2_7_* -->\n\nWrite ...")
    [heading] = find_headings(nb)
    assert (heading.key, heading.points, heading.label) == ("q2_7", 3, "Question 2.3")
    assert question_labels(nb) == {"q2_7": "Question 2.3"}
    assert check_points("lab9", nb) == []
    assert check_points_table("lab9", nb) == []  # the table's "Question 2.3" row is the heading's question


def test_without_the_comment_the_number_is_the_key():
    nb = _lab("#### Question 2.3 (3 points)")
    assert [h.key for h in find_headings(nb)] == ["q2_3"]
    problems = " ".join(str(p) for p in check_points("lab9", nb))
    assert "Question 2.3 heading has no graded cell" in problems and "have no '#### Question 2.7" in problems


def test_a_label_shown_twice_and_a_bonus_key_under_a_question_are_problems():
    nb = _lab("#### Question 2.3 (3 points) <!-- grade ids q2_7_* -->\n\n#### Question 2.3 (3 points)")
    assert any("has a second heading" in str(p) for p in check_points("lab9", nb))
    nb = _lab("#### Question 2.3 (3 points) <!-- grade ids b2_7_* -->")
    assert any("a bonus question's ids" in str(p) for p in check_points("lab9", nb))


def test_feedback_rows_show_the_heading_label():
    nb = _lab("#### Question 2.3 (3 points) <!-- grade ids q2_7_* -->")
    nb.cells[-1].metadata["nbgrader"]["score"] = 3
    assert [row["label"] for row in question_rows(nb)] == ["Question 2.3"]
