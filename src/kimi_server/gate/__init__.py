"""Admission: who may call (auth); later rate limits, quotas and the usage ledger."""
