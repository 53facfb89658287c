"""Reconciliation and recovery: prove Redis and SQL agree, repair them when they do not.

``drift`` finds and classifies disagreements (a pure function of two snapshots), ``reconciler``
reads the snapshots and repairs, ``recovery`` rebuilds an item's Redis state from SQL.
"""
