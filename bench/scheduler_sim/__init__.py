"""The trace-driven cluster simulator of bench/scheduler.py (issue 58): traces, cluster, policies."""
