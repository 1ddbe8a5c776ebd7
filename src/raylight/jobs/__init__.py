"""Product: runs on a remote cluster as Ray Jobs (``raylight submit``, ``raylight jobs``).
"""
