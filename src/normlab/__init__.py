"""normlab: an experiment harness for normalization ablations in GPT transformers."""

__version__ = "0.1.0"
