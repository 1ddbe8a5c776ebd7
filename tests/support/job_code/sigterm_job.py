"""A driver its node stops: the first attempt is ended by SIGTERM (as a spot instance's
shutdown does), the resubmitted one (RAYLIGHT_RESUME=1) finishes."""

import os
import signal

if os.environ.get("RAYLIGHT_RESUME") != "1":
    print("TERMINATING", flush=True)
    os.kill(os.getpid(), signal.SIGTERM)
print("SECOND ATTEMPT", flush=True)
