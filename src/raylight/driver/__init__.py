"""The driver wing: what runs in the process that starts a run: the trainer's
wiring, the controller and its policies, the recorder, progress, the embedded
Ray runtime, experiment loggers, plots, the job environment.
"""
