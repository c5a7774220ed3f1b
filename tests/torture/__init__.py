"""The torture suite: fault injection under load, in the spirit of Jepsen.

Run on its own with ``scripts/torture`` (short mode) or ``scripts/torture
--long`` (soak). See ``docs/torture.md``.
"""
