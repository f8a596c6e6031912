"""What a TA or instructor runs (``python -m course VERB``): the verbs (build, lint, check, bundle, solutions, grade,
feedback, measure, demo) and what only they use: staging submissions, starting nbgrader processes, the measuring
process. Imports ``grader`` (to start grading) and ``common``; nothing here runs inside nbgrader or a kernel."""
