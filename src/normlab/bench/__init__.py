"""The benchmarks of ``normlab-bench``: norm kernels (``norms``) and training steps (``step``)."""
