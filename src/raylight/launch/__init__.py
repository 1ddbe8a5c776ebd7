"""`raylight run`: any torchrun-style script on raylight's engine, unchanged.

``driver.py`` (the command's driver side, on ``raylight.Trainer``), ``agent.py`` (the
loop each worker runs: the script in a child process), ``bootstrap.py`` (the child's
first code) and ``client.py`` (``raylight.run_context()`` inside the script). Nothing is
imported here: a script's ``raylight.run_context()`` loads ``client.py`` alone.
"""
