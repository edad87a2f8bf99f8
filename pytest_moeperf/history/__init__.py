"""Perf history: every session's per-metric summaries and verdicts in a database (SQLite file or PostgreSQL),
change points over them, trend plots and a self-contained HTML report.

Nothing here is imported by the plugin at module import time: matplotlib, apache-otava and psycopg are optional
(the ``history`` extra) and are imported where they are used.
"""
