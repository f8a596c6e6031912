"""``python tests/lab_harness.py LAB VARIANTS_MODULE OUT_JSON``: the harness of prepared answers, now
``python -m course.cli.harness LAB OUT_JSON --variants VARIANTS_MODULE`` (course/cli/harness.py, which ``course check`` runs).
Kept so that the command the lab authors know goes on working."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from course.cli.harness import main  # noqa: E402

if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    lab, variants, out = sys.argv[1:4]
    sys.exit(main([lab, out, "--variants", variants]))
