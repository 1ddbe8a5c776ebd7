"""The worker wing: everything that runs inside a training process, on Ray or not
(the Ray actor, an external launcher's process, the driver's own process).
"""
