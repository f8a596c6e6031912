"""Course tooling for Efficient AI Labs: build, check, grade, feedback and the demo round.

Run ``python -m course --help`` from the repository root. Each job lives in its own module:
``build`` (labs/ -> source/ -> release/), ``lint`` and ``check`` (the instructor's pre-release gate),
``grade`` (autograde a class), ``feedback`` and ``demo``.
"""
