"""What runs inside (or starts) a grading kernel: standard library and torch only, sent to the kernel as source
(``boundary_kernel``, ``guard_kernel``, ``measure_probe``) or started by path (``kernel_limits`` -> ``bwrap`` ->
``kernel_boot``). Imports nothing else of ``course``."""
