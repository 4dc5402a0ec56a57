"""Shipped tpload configs (installed as ``tpload.configs``; load one by name)."""
