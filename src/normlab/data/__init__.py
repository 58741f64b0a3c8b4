"""Corpus -> documents -> tokens -> uint16 shards (cached) -> deterministic batches.

``corpus`` (local files, packaged corpora) and ``sources`` (the Hub) give documents; ``tokenizer``
encodes and decodes; ``workers`` tokenizes in processes; ``shards`` writes the token folder;
``tokens.prepare`` finds or builds it and returns :class:`TokenData`; ``sampler`` draws batches.
"""

from normlab.data.corpus import DataError
from normlab.data.sampler import BatchSampler
from normlab.data.tokens import TokenData, prepare

__all__ = ["BatchSampler", "DataError", "TokenData", "prepare"]
