"""The static scan of student code (course.grader.scan): each rule on a small example, and no flag on honest code.

False positives cost a TA's time and a student's trust: the reference solutions of every lab, and every prepared
alternative answer, must raise no flag.
"""
from __future__ import annotations

import importlib.util

import nbformat
import pytest

from course.common.notebooks import make_submission, read_notebook, replace_cell_source
from course.common.paths import REPO_ROOT, discover_labs
from course.grader.scan import scan_notebook

SETUP = "import math\nimport sys\nimport torch\nimport numpy as np\nimport matplotlib.pyplot as plt\n\ndef check(x):\n    return x"
TESTS = 'assert abs(add(1, 2) - 3) < 1e-9, "add(1, 2) must be 3"\nassert isinstance(add(1, 2), int)'


def cell(source: str, gid: str | None = None, **nbgrader):
    new = nbformat.v4.new_code_cell(source)
    if gid:
        new.metadata["nbgrader"] = {"grade_id": gid, "schema_version": 3, "grade": False, "solution": False,
                                    "locked": False, "task": False, **nbgrader}
    return new


def notebook(student_source: str):
    """A locked setup cell, the student's answer cell ``q1_1_add``, a locked test cell, an ordinary cell."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        cell(SETUP, "setup_imports", locked=True),
        cell(student_source, "q1_1_add", solution=True),
        cell(TESTS, "q1_1_add_tests", grade=True, locked=True, points=3),
        cell("x = 1"),
    ]
    return nb


@pytest.mark.parametrize(
    "source, flag",
    [
        ("import ctypes", "import ctypes"),
        ("import gc\nobjs = gc.get_objects()", "uses gc.get_objects"),
        ("import inspect\nframe = inspect.currentframe()", "import inspect"),
        ("from inspect import stack", "from inspect import stack"),
        ("import importlib\nimportlib.reload(math)", "import importlib"),
        ("import builtins\nbuiltins.print = None", "import builtins"),
        ("from IPython.core.interactiveshell import InteractiveShell", "from IPython.core.interactiveshell import InteractiveShell"),
        ("import ipykernel.kernelbase", "import ipykernel.kernelbase"),
        ("f = sys._getframe(1)", "uses sys._getframe"),
        ("sys.settrace(lambda *a: None)", "uses sys.settrace"),
        ("sys.setprofile(None)", "uses sys.setprofile"),
        ("sys.addaudithook(print)", "uses sys.addaudithook"),
        ("with torch._C.DisableTorchFunction():\n    y = torch.mm(a, b)", "uses torch._C"),
        ("get_ipython().events.register('post_run_cell', print)", "get_ipython().events"),
        ("ip = get_ipython()\nip.input_transformers_cleanup.append(str)", "get_ipython().input_transformers_cleanup"),
        ("get_ipython().input_transformers_post.append(str)", "get_ipython().input_transformers_post"),
        ("get_ipython().ast_transformers.append(object())", "get_ipython().ast_transformers"),
        ("get_ipython().display_formatter.formatters.clear()", "get_ipython().display_formatter"),
        ("get_ipython().user_expressions({})", "get_ipython().user_expressions"),
        ("get_ipython().run_cell('1')", "get_ipython().run_cell"),
        ("get_ipython().showtraceback = print", "get_ipython().showtraceback"),
        ("get_ipython().displayhook(3)", "get_ipython().displayhook"),
        ("torch.allclose = lambda *a, **k: True", "assigns torch.allclose"),
        ("torch.Tensor.__eq__ = lambda self, other: True", "assigns torch.Tensor.__eq__"),
        ("np.testing.assert_allclose = print", "assigns numpy.testing.assert_allclose"),
        ("def add(a, b):\n    math.isclose = lambda *a, **k: True\n    return a + b", "assigns math.isclose"),
        ("setattr(torch, 'allclose', print)", "setattr on torch"),
        ("delattr(math, 'isclose')", "delattr on math"),
        ("del math.isclose", "deletes math.isclose"),
        ("t = torch\nt.allclose = print", "assigns torch.allclose"),
        ("object.__setattr__(torch, 'allclose', print)", "calls object.__setattr__"),
        ("torch.__dict__['allclose'] = print", "uses torch.__dict__"),
        ("class T(torch.Tensor):\n    @classmethod\n    def __torch_function__(cls, *a, **k):\n        return True",
         "class T defines __torch_function__"),
        ("class M:\n    def __torch_dispatch__(self, *a):\n        pass", "class M defines __torch_dispatch__"),
        ("class Any:\n    def __eq__(self, other):\n        return True", "class Any defines __eq__"),
        ("class Yes:\n    __bool__ = lambda self: True", "class Yes defines __bool__"),
        ("x.__class__ = int", "assigns x.__class__"),
        ("sys.modules['math'] = None", "uses sys.modules"),
        ("sys.path.insert(0, '/tmp')", "uses sys.path.insert"),
        ("sys.meta_path.insert(0, object())", "uses sys.meta_path.insert"),
        ("import os\nif os.environ.get('NBGRADER_EXECUTION'):\n    pass", "mentions NBGRADER: 'NBGRADER_EXECUTION'"),
        ("text = open('../../../source/lab1/lab1.ipynb').read()", "path '../../../source/lab1/lab1.ipynb'"),
        ("import sqlite3\ndb = sqlite3.connect('/course/gradebook.db')", "path '/course/gradebook.db'"),
        ("data = open(f'{root}/autograded/bob/lab1/lab1.ipynb')", "path '/autograded/bob/lab1/lab1.ipynb'"),
        ("import os\nos.listdir('/course/submitted/')", "path '/course/submitted/'"),
        ("import subprocess\nsubprocess.run(['ls'])", "import subprocess"),
        ("import socket", "import socket"),
        ("import os\nos.system('ls')", "uses os.system"),
        ("from os import popen", "from os import popen"),
        ("exec('x = 1')", "calls exec"),
        ("eval('1 + 1')", "calls eval"),
        ("code = compile('1', 'f', 'eval')", "calls compile"),
        ("__import__('ctypes')", "calls __import__"),
        ("globals()['add'] = print", "calls globals"),
        ("_efficient_ai_guard.disable()", "name _efficient_ai_guard"),
        ("x = obj._efficient_ai_key", "attribute _efficient_ai_key"),
        ("math = None", "rebinds math (imported by a locked cell)"),
        ("import numpy as torch", "rebinds torch (imported by a locked cell)"),
        ("def check(x):\n    return True", "rebinds check (defined by a locked cell)"),
        ("abs = lambda x: 0", "rebinds abs (a builtin the tests use)"),
        ("def add(a, b)\n    return a + b", "does not parse (line 1: "),
        ("!cat ../../source/lab1/lab1.ipynb", "shell command 'cat ../../source/lab1/lab1.ipynb'"),
        ("files = !ls", "shell command 'ls'"),
        ("%%bash\nls /", "%%bash cell"),
        ("%%writefile utils.py\nSCALE = 'x'", "%%writefile utils.py cell"),
        ("%pip install numpy", "%pip install numpy"),
        ("%cd ..", "%cd .."),
        ("%time import ctypes", "import ctypes"),
        ("%%time\nimport inspect", "import inspect"),
    ],
)
def test_each_rule_flags_its_example(source, flag):
    flags = scan_notebook(notebook(source))
    assert any(f.startswith(f"q1_1_add: {flag}") for f in flags), f"expected the flag {flag!r}, got {flags}"


@pytest.mark.parametrize(
    "source",
    [
        "def add(a, b):\n    return a + b",
        "import torch\nfrom torch import nn\nimport torch.nn.functional as F\nimport numpy as np\nimport math",
        "import gc\ngc.collect()",
        "torch.backends.cudnn.benchmark = True\ntorch._dynamo.config.cache_size_limit = 64",
        "plt.rcParams['figure.figsize'] = (6, 4)",
        "import os\nos.environ['TOKENIZERS_PARALLELISM'] = 'false'",
        "from IPython.display import display, Markdown\ndisplay(Markdown('**done**'))",
        "%timeit -n 3 add(1, 2)",
        "%matplotlib inline",
        "class Net(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n        self.w = torch.nn.Parameter(torch.ones(2))\n"
        "    def forward(self, x):\n        return x * self.w\n    def __repr__(self):\n        return 'Net'",
        "model = torch.nn.Linear(2, 2)\nmodel.weight = torch.nn.Parameter(torch.zeros(2, 2))\nsetattr(model, 'bias', None)",
        "compiled = torch.compile(add)\npattern = __import__  # a reference, not a call\nfn.__doc__ = 'doc'",
        "print('the source code of add is short')\nlabel = 'open-source/model'",
        "def add(a, b):\n    total = sum([a, b])  # a builtin used, not rebound\n    return total",
    ],
    ids=["answer", "re-imports", "gc-collect", "torch-config", "rcparams", "environ", "display", "timeit",
         "matplotlib-magic", "module-class", "model-attributes", "harmless-names", "words", "builtins-used"],
)
def test_honest_code_raises_no_flag(source):
    assert scan_notebook(notebook(source)) == []


def test_locked_cells_are_not_scanned_and_flags_name_the_cell():
    nb = notebook("def add(a, b):\n    return a + b")
    nb.cells[2].source += "\nimport inspect"  # instructor's code: never flagged
    nb.cells[3].source = "import ctypes"
    assert scan_notebook(nb) == ["cell 3: import ctypes"]


def load_alternatives(lab: str) -> dict[str, list[str]]:
    path = REPO_ROOT / "labs" / lab / "variants.py"
    if not path.exists():
        return {}
    spec = importlib.util.spec_from_file_location(f"{lab}_variants_for_scan", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.ALTERNATIVES


@pytest.mark.parametrize("lab", discover_labs(REPO_ROOT))
def test_reference_solutions_and_alternatives_raise_no_flag(lab):
    source_nb = read_notebook(REPO_ROOT / "source" / lab / f"{lab}.ipynb")
    release_nb = read_notebook(REPO_ROOT / "release" / lab / f"{lab}.ipynb")
    reference = make_submission(release_nb, source_nb)
    assert scan_notebook(reference) == [], f"{lab}: the reference solution must raise no flag"
    assert scan_notebook(release_nb) == [], f"{lab}: the blank release must raise no flag"
    flagged = {
        f"{gid} #{number}": flags
        for gid, answers in load_alternatives(lab).items()
        for number, answer in enumerate(answers)
        if (flags := scan_notebook(replace_cell_source(reference, gid, answer)))
    }
    assert flagged == {}, f"{lab}: correct alternative answers must raise no flag"
