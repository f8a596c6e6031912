"""Course tooling for Efficient AI Labs: ``python -m course --help`` from the repository root lists its jobs
(build, lint, check, bundle, solutions, grade, feedback, demo), each in its own module."""
