"""Process exit codes raylight gives a meaning to, in one place.

A driver that ends with ``PREEMPTED_EXIT_CODE`` says "my run was preempted and cannot
go on here; resubmit me and I resume from my last committed checkpoint". A driver
ended by SIGTERM (what a node being preempted or scaled down sends its processes)
stops its run in order and exits ``TERMINATED_EXIT_CODE``, as a shell reports a process
that SIGTERM ended. ``raylight submit --retries`` resubmits both (see
``raylight.jobs.submission.retry_reason``).
"""

from __future__ import annotations

import signal

# 75 is EX_TEMPFAIL in BSD's sysexits.h: "a temporary failure; the user is invited to
# retry". Nothing else in Python or Ray exits with it.
PREEMPTED_EXIT_CODE = 75
# 128 + N: the shells' convention for "ended by signal N" (143 for SIGTERM, 137 for SIGKILL).
TERMINATED_EXIT_CODE = 128 + signal.SIGTERM
KILLED_EXIT_CODE = 128 + signal.SIGKILL
