"""`raylight run`: any torchrun-style script on raylight's engine, unchanged.

``driver.py`` (the command's driver side, on ``raylight.Trainer``), ``agent.py`` (the
loop each worker runs: the script in a child process) and ``bootstrap.py`` (the child's
first code). The script's end of the agent channel, ``raylight.run_context()``, is the
core's (``raylight.worker.run_channel``), so products other than this one (``hvd.elastic``)
may use it. Nothing is imported here.
"""
