"""The cluster recipes: the Slurm job-array script and the Kubernetes Indexed Job run the same shard command,
and running them for real (shard 0/2 through the Slurm script, shard 1/2 through the Job's command) grades the
whole class into one PostgreSQL gradebook with the expected scores."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

from course.nbgrader_run import read_scores  # noqa: E402
from fixture_lab import LAB, REPO, built_root, make_class  # noqa: E402

SLURM = REPO / "deploy" / "slurm" / "grade_array.sbatch"
K8S = REPO / "deploy" / "k8s" / "grade-job.yaml"


def slurm_command() -> str:
    return next(line for line in SLURM.read_text().splitlines() if line.startswith("python -m course grade"))


def k8s_job() -> dict:
    return yaml.safe_load(K8S.read_text())


def k8s_container(job: dict) -> dict:
    return job["spec"]["template"]["spec"]["containers"][0]


def normalized(command: str) -> str:
    """The shard command with each scheduler's own variable names replaced by placeholders."""
    for pattern, placeholder in (
        (r"\$\{SLURM_ARRAY_TASK_ID\}/\$\{SLURM_ARRAY_TASK_COUNT\}", "{shard}"),
        (r"\$\{JOB_COMPLETION_INDEX\}/\$\{SHARDS\}", "{shard}"),
    ):
        command = re.sub(pattern, placeholder, command)
    return command


def test_slurm_script_is_valid_bash_with_an_array_shard_command():
    subprocess.run(["bash", "-n", str(SLURM)], check=True)
    text = SLURM.read_text()
    assert "#SBATCH" in text and "--array=" in text
    assert "--shard \"${SLURM_ARRAY_TASK_ID}/${SLURM_ARRAY_TASK_COUNT}\"" in slurm_command()


def test_k8s_manifest_is_an_indexed_job_whose_shards_cover_the_class():
    job = k8s_job()
    assert job["apiVersion"] == "batch/v1" and job["kind"] == "Job"
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed", "each pod needs its JOB_COMPLETION_INDEX"
    env = {e["name"]: e.get("value") for e in k8s_container(job)["env"]}
    assert int(env["SHARDS"]) == spec["completions"], "SHARDS must equal completions or students are skipped"
    assert any(e["name"] == "NBGRADER_DB_URL" for e in k8s_container(job)["env"]), "shards share one PostgreSQL gradebook"


def test_both_recipes_run_the_same_shard_command():
    k8s_command = k8s_container(k8s_job())["args"][0]
    assert normalized(k8s_command) == normalized(slurm_command())
    assert normalized(slurm_command()).startswith('python -m course grade "$LAB" --shard "{shard}"')


def test_running_both_recipes_grades_the_whole_class(postgres, tmp_path):
    root = built_root(tmp_path / "root")
    course = tmp_path / "course"
    expected = make_class(root, course, size=4)
    db_url = postgres.create_database("gradebook_deploy")
    env = {
        **os.environ,
        "PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")]),
        "PYTHONPATH": str(REPO),
        "NBGRADER_DB_URL": db_url,
        "COURSE_DIR": str(course),
        "WORKERS": "1",
    }
    slurm = subprocess.run(["bash", str(SLURM), LAB], cwd=REPO, capture_output=True, text=True, timeout=600,
                           env={**env, "SLURM_ARRAY_TASK_ID": "0", "SLURM_ARRAY_TASK_COUNT": "2"})
    assert slurm.returncode == 0, slurm.stdout[-2000:] + slurm.stderr[-2000:]
    container = k8s_container(k8s_job())
    k8s_env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    k8s = subprocess.run([*container["command"], container["args"][0]], cwd=REPO, capture_output=True, text=True, timeout=600,
                         env={**env, **k8s_env, "LAB": LAB, "SHARDS": "2", "JOB_COMPLETION_INDEX": "1", "COURSE_DIR": str(course)})
    assert k8s.returncode == 0, k8s.stdout[-2000:] + k8s.stderr[-2000:]
    os.environ["NBGRADER_DB_URL"] = db_url
    try:
        scores = read_scores(course, LAB)
    finally:
        del os.environ["NBGRADER_DB_URL"]
    assert {s: sub.autograded_score() for s, sub in scores.items()} == expected
