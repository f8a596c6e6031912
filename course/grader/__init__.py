"""What runs inside an nbgrader process (``nbgrader_config.py`` loads it; ``course grade`` starts one per
submission): the grading job's body, ``GuardedExecute`` and its kernel links, the grading boundary that runs test
cells, the sandbox provisioner and its settings, and the nbgrader plugins (feedback views, late penalties, LMS
collection and export, sanitizing). Imports ``common``, and ``kernel`` only for the files it starts or installs."""
