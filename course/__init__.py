"""Course tooling for Efficient AI Labs: ``python -m course --help`` from the repository root lists its jobs.

Four rooms, by where their code runs: ``cli`` (the verbs a TA or instructor runs), ``grader`` (inside an nbgrader
process), ``kernel`` (inside a grading kernel) and ``common`` (the vocabulary all of them share). docs/LAYOUT.md draws
them on one page."""
