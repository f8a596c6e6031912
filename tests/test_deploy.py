"""The cluster recipes: the Slurm job-array script and the Kubernetes Indexed Job run the same shard command.

The Slurm script is submitted for real (``sbatch --array --wait``) to a single-node Slurm cluster started on
this machine (tests/slurm_cluster.py) and must grade the whole class into one PostgreSQL gradebook with the
expected scores. Kubernetes cannot run here: the Job's manifest is checked against the Kubernetes API's fields,
against the image deploy/Containerfile builds and against what the grading sandbox needs, and the Job's command
is run by hand as its container would run it.
"""
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from fixture_lab import LAB, REPO, built_root, make_class  # noqa: E402
from slurm_cluster import SlurmCluster, missing_programs  # noqa: E402

from course.common.scores import read_scores  # noqa: E402

SLURM = REPO / "deploy" / "slurm" / "grade_array.sbatch"
K8S = REPO / "deploy" / "k8s" / "grade-job.yaml"
CONTAINERFILE = REPO / "deploy" / "Containerfile"
BUILD_IMAGE = REPO / "deploy" / "build_image.sh"
SHARD_COMMAND = 'python -m course grade "$LAB" --shard "{shard}" --workers "$WORKERS" --resume --course-dir "$COURSE_DIR"'
GRADING_TIMEOUT_S = 600
IMAGE_ENV = "EFFICIENT_AI_TEST_IMAGE"  # a built grading image to check the sandbox in (not in CI: ~10 min, 3.5 GB)
PODMAN_ARGS_ENV = "EFFICIENT_AI_PODMAN_ARGS"  # extra `podman run` flags this host needs (runtime, ulimits)
SANDBOX_PROBE = "from course.grader.sandbox import unavailable_reason as r; print(r() or 'sandbox ok')"
SCALARS = {"str": (str, int, float), "int": (int,), "bool": (bool,), "float": (int, float), "object": (object,),
           "datetime": (str,)}


def slurm_command() -> str:
    return next(line for line in SLURM.read_text().splitlines() if line.startswith("python -m course grade"))


def k8s_job() -> dict:
    return yaml.safe_load(K8S.read_text())


def k8s_pod(job: dict) -> dict:
    return job["spec"]["template"]["spec"]


def k8s_container(job: dict) -> dict:
    return k8s_pod(job)["containers"][0]


def k8s_env(job: dict) -> dict:
    return {e["name"]: e.get("value") for e in k8s_container(job)["env"]}


def containerfile_value(instruction: str) -> str:
    """The argument of the last ``INSTRUCTION`` line of deploy/Containerfile (``USER``, ``WORKDIR``)."""
    lines = [line.split(None, 1)[1].strip() for line in CONTAINERFILE.read_text().splitlines()
             if line.split(None, 1)[:1] == [instruction]]
    assert lines, f"deploy/Containerfile has no {instruction} line"
    return lines[-1]


def normalized(command: str) -> str:
    """The shard command with each scheduler's own variable names replaced by a placeholder."""
    for pattern in (r"\$\{SLURM_ARRAY_TASK_ID\}/\$\{SLURM_ARRAY_TASK_COUNT\}", r"\$\{JOB_COMPLETION_INDEX\}/\$\{SHARDS\}"):
        command = re.sub(pattern, "{shard}", command)
    return command


def api_problems(data, type_name: str, where: str = "") -> list[str]:
    """Where ``data`` (parsed YAML) breaks the Kubernetes API's schema of ``type_name`` (e.g. ``V1Job``): unknown
    fields and values of the wrong type, from the official client's models. Quantities and int-or-string
    fields are typed ``str`` there and accept numbers; a YAML boolean (``on``, ``yes``) is never a string."""
    if item_type := re.fullmatch(r"[lL]ist\[(.+)\]", type_name):  # the client writes list[X] or List[X]
        if not isinstance(data, list):
            return [f"{where or '.'}: expected a list"]
        return [p for i, item in enumerate(data) for p in api_problems(item, item_type[1], f"{where}[{i}]")]
    if value_type := re.fullmatch(r"(?:dict\(|Dict\[)str, (.+)[)\]]", type_name):  # dict(str, X) or Dict[str, X]
        if not isinstance(data, dict):
            return [f"{where or '.'}: expected a mapping"]
        return [p for key, value in data.items() for p in api_problems(value, value_type[1], f"{where}.{key}")]
    if type_name in SCALARS:
        wrong = isinstance(data, bool) and type_name != "bool" and type_name != "object"
        return [] if isinstance(data, SCALARS[type_name]) and not wrong else [f"{where}: expected {type_name}, got {data!r}"]
    import kubernetes.client

    model = getattr(kubernetes.client, type_name)
    if not isinstance(data, dict):
        return [f"{where or '.'}: expected a {type_name} mapping"]
    attribute = {json_name: name for name, json_name in model.attribute_map.items()}
    problems = [f"{where}.{key}: not a field of {type_name}" for key in data if key not in attribute]
    return problems + [p for key, value in data.items() if key in attribute
                       for p in api_problems(value, model.openapi_types[attribute[key]], f"{where}.{key}")]


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
    env = k8s_env(job)
    assert int(env["SHARDS"]) == spec["completions"], "SHARDS must equal completions or students are skipped"
    assert "NBGRADER_DB_URL" in env, "shards share one PostgreSQL gradebook"


def test_k8s_manifest_has_only_fields_of_the_kubernetes_api():
    assert api_problems(k8s_job(), "V1Job") == []
    typo = {"spec": {"completionz": 2, "template": {"spec": {"containers": [{"name": "x", "env": [{"name": "A", "value": True}]}]}}}}
    assert api_problems(typo, "V1Job") == [".spec.completionz: not a field of V1JobSpec",
                                           ".spec.template.spec.containers[0].env[0].value: expected str, got True"]


def test_both_recipes_run_the_same_shard_command():
    k8s_command = k8s_container(k8s_job())["args"][0]
    assert normalized(k8s_command) == normalized(slurm_command()) == SHARD_COMMAND


def test_slurm_script_grades_sandboxed_whatever_the_environment_says(tmp_path):
    """The script forces EFFICIENT_AI_SANDBOX=on (a stand-in python records what it was run with)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").write_text('#!/bin/sh\necho "sandbox=$EFFICIENT_AI_SANDBOX $*" > "$RECORD"\n')
    (bin_dir / "python").chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "RECORD": str(tmp_path / "record"), "EFFICIENT_AI_SANDBOX": "off",
           "NBGRADER_DB_URL": "postgresql://db/gradebook", "SLURM_ARRAY_TASK_ID": "2", "SLURM_ARRAY_TASK_COUNT": "3",
           "SLURM_GPUS_ON_NODE": "2"}
    subprocess.run(["bash", str(SLURM), LAB], cwd=tmp_path, env=env, check=True, timeout=60)
    assert (tmp_path / "record").read_text().split() == [
        "sandbox=on", "-m", "course", "grade", LAB, "--shard", "2/3", "--workers", "2", "--resume", "--course-dir", str(tmp_path)]


def test_k8s_job_gives_the_sandbox_what_it_needs():
    job = k8s_job()
    pod, container = k8s_pod(job), k8s_container(job)
    assert k8s_env(job)["EFFICIENT_AI_SANDBOX"] == "on", "a cluster run must refuse to grade unsandboxed"
    assert pod["hostUsers"] is False, "procMount: Unmasked needs a user-namespaced pod"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "Unconfined"}, "the default profile refuses unshare()"
    assert pod["securityContext"]["appArmorProfile"] == {"type": "Unconfined"}, "the default profile refuses mount()"
    assert container["securityContext"]["procMount"] == "Unmasked", "bwrap mounts a fresh /proc"
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert "privileged" not in container["securityContext"]


def test_k8s_job_runs_the_image_deploy_builds():
    job = k8s_job()
    pod, container = k8s_pod(job), k8s_container(job)
    default_image = re.search(r'^IMAGE="\$\{IMAGE:-(.+)\}"$', BUILD_IMAGE.read_text(), re.M).group(1)
    assert container["image"] == default_image
    user, group = containerfile_value("USER").split(":")
    assert int(user) != 0, "the image runs as a non-root user"
    assert (pod["securityContext"]["runAsUser"], pod["securityContext"]["runAsGroup"]) == (int(user), int(group))
    assert container["workingDir"] == containerfile_value("WORKDIR"), "python -m course runs from the image's project"


def test_containerfile_installs_the_project_its_requirements_and_bubblewrap():
    text = CONTAINERFILE.read_text()
    assert re.search(r"apt-get install[^\n]*(\\\n[^\n]*)*\bbubblewrap\b", text), "the sandbox needs bwrap"
    assert "pip install -r /opt/efficient-ai-labs/requirements.txt" in text
    assert f"COPY . {containerfile_value('WORKDIR')}" in text
    assert re.search(r"^ENV [^\n]*EFFICIENT_AI_SANDBOX=on", text, re.M)
    ignored = (REPO / ".dockerignore").read_text().split()
    assert {".git", "submitted", "autograded", "grading", "feedback"} <= set(ignored), "class data stays out of the image"
    subprocess.run(["bash", "-n", str(BUILD_IMAGE)], check=True)


def podman_security_args(job: dict) -> list[str]:
    """``podman run`` flags doing what the Job's pod and container securityContext ask of the runtime."""
    pod, container = k8s_pod(job), k8s_container(job)
    pod_context, context = pod["securityContext"], container["securityContext"]
    args = ["--user", f"{pod_context['runAsUser']}:{pod_context['runAsGroup']}"]
    if pod.get("hostUsers") is False:  # the pod's own user namespace: container root is an unprivileged host uid
        args += ["--uidmap", "0:200000:65536", "--gidmap", "0:200000:65536"]
    for profile, option in (("seccompProfile", "seccomp"), ("appArmorProfile", "apparmor")):
        if pod_context.get(profile, {}).get("type") == "Unconfined":
            args += ["--security-opt", f"{option}=unconfined"]
    if context.get("procMount") == "Unmasked":
        args += ["--security-opt", "unmask=ALL"]
    if context.get("allowPrivilegeEscalation") is False:
        args += ["--security-opt", "no-new-privileges"]
    return args + [f"--cap-drop={cap}" for cap in context.get("capabilities", {}).get("drop", [])]


def test_grading_image_sandboxes_under_the_jobs_security_context():
    """In the built image, bwrap works with the Job's settings and not in a default container (so they matter)."""
    image, podman = os.environ.get(IMAGE_ENV), shutil.which("podman")
    if not image or not podman:
        pytest.skip(f"set {IMAGE_ENV} to an image built by deploy/build_image.sh (and install podman): building "
                    "it takes minutes and gigabytes, so CI does not")
    job = k8s_job()
    run = [podman, "run", "--rm", *shlex.split(os.environ.get(PODMAN_ARGS_ENV, ""))]
    probe = ["python", "-c", SANDBOX_PROBE]
    as_job = subprocess.run([*run, *podman_security_args(job), image, *probe], capture_output=True, text=True, timeout=300)
    assert as_job.stdout.strip() == "sandbox ok", as_job.stdout + as_job.stderr
    default = subprocess.run([*run, image, *probe], capture_output=True, text=True, timeout=300)
    assert default.returncode == 0 and default.stdout.strip() != "sandbox ok", default.stdout + default.stderr


def grading_env(db_url: str) -> dict[str, str]:
    """This interpreter first on PATH, the repository importable, the shared gradebook; nothing a recipe sets."""
    env = {k: v for k, v in os.environ.items() if k not in ("COURSE_DIR", "WORKERS", "EFFICIENT_AI_SANDBOX")}
    return {**env, "PATH": os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")]),
            "PYTHONPATH": str(REPO), "NBGRADER_DB_URL": db_url}


def gradebook_scores(course: Path, db_url: str) -> dict[str, float]:
    os.environ["NBGRADER_DB_URL"] = db_url
    try:
        return {s: sub.autograded_score() for s, sub in read_scores(course, LAB).items()}
    finally:
        del os.environ["NBGRADER_DB_URL"]


@pytest.fixture(scope="module")
def lab_root(tmp_path_factory) -> Path:
    """The fixture lab built once for this module's classes."""
    return built_root(tmp_path_factory.mktemp("deploy") / "root")


@pytest.fixture(scope="module")
def slurm():
    """A single-node Slurm cluster on 127.0.0.1 for this module (Debian's slurm-wlm and munge packages)."""
    missing = missing_programs()
    why = (f"Slurm is not installed ({', '.join(missing)} missing; apt-get install slurm-wlm munge)" if missing
           else "a test Slurm cluster needs root (slurmd starts jobs as their user)" if os.geteuid() != 0 else None)
    if why:
        if os.environ.get("CI"):
            pytest.fail(f"{why}: scripts/test.sh installs slurm-wlm and munge when run as root")
        pytest.skip(why)
    cluster = SlurmCluster().start()
    yield cluster
    cluster.stop()


def test_slurm_job_array_grades_the_whole_class(slurm, postgres, lab_root, tmp_path):
    """sbatch --array=0-1 --wait from the course folder: two shards, one student each, one gradebook."""
    course = tmp_path / "course"
    expected = make_class(lab_root, course, size=2)
    db_url = postgres.create_database("gradebook_slurm")
    result = slurm.sbatch(["--array=0-1", "--wait", str(SLURM), LAB], cwd=course, env=grading_env(db_url),
                          timeout_s=GRADING_TIMEOUT_S)
    logs = sorted(course.glob("autograde-*_*.out"))
    report = "\n".join([result.stdout, result.stderr, *(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in logs),
                        "--- slurmd.log", slurm.log("slurmd.log")[-2000:]])
    assert result.returncode == 0, report
    assert [re.sub(r"autograde-\d+_", "", p.name) for p in logs] == ["0.out", "1.out"], report
    for log, student in zip(logs, sorted(expected)):
        text = log.read_text()
        assert "1 submission(s)" in text and re.search(rf"^{student} ", text, re.M), report
        assert "sandbox: every grading kernel ran in bubblewrap" in text, report
    assert gradebook_scores(course, db_url) == expected


def test_slurm_script_refuses_to_grade_where_bwrap_is_missing(postgres, lab_root, tmp_path):
    """On a node without bubblewrap the task fails before grading anyone, instead of grading unsandboxed."""
    course = tmp_path / "course"
    make_class(lab_root, course, size=1)
    db_url = postgres.create_database("gradebook_unsandboxed")
    env = {**grading_env(db_url), "PATH": os.path.dirname(sys.executable), "EFFICIENT_AI_SANDBOX": "auto",
           "SLURM_ARRAY_TASK_ID": "0", "SLURM_ARRAY_TASK_COUNT": "1"}
    result = subprocess.run(["/bin/bash", str(SLURM), LAB], cwd=course, env=env, capture_output=True, text=True,
                            timeout=GRADING_TIMEOUT_S)
    assert result.returncode != 0
    assert "EFFICIENT_AI_SANDBOX=on, but grading kernels cannot be sandboxed" in result.stdout + result.stderr
    assert gradebook_scores(course, db_url) == {}


def test_k8s_job_command_grades_its_shard(postgres, lab_root, tmp_path):
    """The Job's container command, run as its pod with index 1 of 2 would run it, grades exactly that shard."""
    course = tmp_path / "course"
    expected = make_class(lab_root, course, size=3)
    db_url = postgres.create_database("gradebook_k8s")
    container = k8s_container(k8s_job())
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    env.update(SHARDS="2", JOB_COMPLETION_INDEX="1", COURSE_DIR=str(course), LAB=LAB)
    result = subprocess.run([*container["command"], *container["args"]], cwd=REPO, capture_output=True, text=True,
                            timeout=GRADING_TIMEOUT_S, env={**grading_env(db_url), **env})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    shard = sorted(expected)[1::2]
    assert gradebook_scores(course, db_url) == {s: expected[s] for s in shard}
