"""Adopted measurements of other pytest plugins: pytest-benchmark's ``benchmark`` fixture results as metrics of the
ledger (`results`: the mapping, pure; `plugin`: the pytest side)."""
