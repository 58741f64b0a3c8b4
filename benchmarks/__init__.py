"""Checks of the harness itself, kept out of the ``normlab`` package (run from a checkout).

``python -m benchmarks baseline``: normlab's training step against a plain-PyTorch loop of the same
model, batches and settings (``plain_loop``); ``python -m benchmarks profile 1,2``: where normlab's
step spends more than that loop (``profile_step``); ``python -m benchmarks settings``: N training
setups round-robin with tokens/s and MFU (``settings``). ``python -m benchmarks --help`` lists
their options.
"""
