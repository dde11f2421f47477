"""The ledger: usage events from sessions and pools, priced at EC2 rates and at Modal's (``calque report``),
and the labs' budgets against them."""
