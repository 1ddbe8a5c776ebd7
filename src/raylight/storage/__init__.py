"""The storage wing: the run directory and its atomic writes, full and sharded
checkpoints, the run lease. Runs in the driver and in workers.
"""
