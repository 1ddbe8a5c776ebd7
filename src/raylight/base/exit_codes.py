"""Process exit codes raylight gives a meaning to, in one place.

A driver that ends with ``PREEMPTED_EXIT_CODE`` says "my run was preempted and cannot
go on here; resubmit me and I resume from my last committed checkpoint". ``raylight
submit --retries`` resubmits such a job (see ``raylight.jobs.submission.should_retry``).
"""

from __future__ import annotations

# 75 is EX_TEMPFAIL in BSD's sysexits.h: "a temporary failure; the user is invited to
# retry". Nothing else in Python or Ray exits with it.
PREEMPTED_EXIT_CODE = 75
