"""Processing: the pure detection core (``detection``), the stream workers' pure cores (``cores``),
edge digests, and the faust glue (``faust``, run by ``python -m eroica.streams.faust ROLE``).
"""
